//! Memory providers (`plugins.slots.memory`) and the helper that turns the active one's prompt
//! section into a `systemPromptAddition`, as OpenClaw's `buildMemorySystemPromptAddition`.

use std::collections::BTreeSet;
use std::sync::Arc;

/// A memory plugin's contribution to the system prompt.
pub trait MemoryProvider: Send + Sync + std::fmt::Debug {
    fn id(&self) -> &str;
    /// Prompt lines for the run, given the tools the model can call and the citation mode.
    fn prompt_section(
        &self,
        available_tools: &BTreeSet<String>,
        citations_mode: Option<&str>,
    ) -> Vec<String>;
}

/// The addition for the active memory provider, or `None` when none is configured or it has
/// nothing to say.
pub fn build_memory_system_prompt_addition(
    provider: Option<&Arc<dyn MemoryProvider>>,
    available_tools: &BTreeSet<String>,
    citations_mode: Option<&str>,
) -> Option<String> {
    let lines = provider?.prompt_section(available_tools, citations_mode);
    let lines: Vec<String> = lines
        .into_iter()
        .filter(|line| !line.trim().is_empty())
        .collect();
    if lines.is_empty() {
        None
    } else {
        Some(lines.join("\n"))
    }
}
