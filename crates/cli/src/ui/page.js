// The page `vilvona ui` serves around the panel: the token from the URL's fragment, the
// session picker, and the panel module (the one OpenClaw's Control UI mounts) over fetch.
import { mountPanel } from "/index.js";

const token = new URLSearchParams(location.hash.slice(1)).get("token") ?? "";
const status = document.getElementById("page-status");
const picker = document.getElementById("session");

/** One request to the server (a view, or a repair), with the token; its error thrown. */
async function post(path, payload) {
  const response = await fetch(path, {
    method: "POST",
    headers: { "Content-Type": "application/json", Authorization: `Bearer ${token}` },
    body: JSON.stringify(payload),
  });
  const answer = await response.json();
  if (!response.ok) throw new Error(answer.error ?? `HTTP ${response.status}`);
  return answer;
}
const request = (payload) => post("/api/view", payload);
const repair = (payload) => post("/api/repair", payload);

let panel;
try {
  const sessions = await request({ view: "sessions" });
  if (sessions.length === 0) status.textContent = "No sessions stored yet.";
  for (const session of sessions) {
    picker.append(new Option(`${session.key} (${session.messages} messages)`, session.key));
  }
  const wanted = new URLSearchParams(location.hash.slice(1)).get("session");
  if (wanted && sessions.some((s) => s.key === wanted || s.id === wanted)) picker.value = sessions.find((s) => s.key === wanted || s.id === wanted).key;
  if (picker.value) panel = mountPanel(document.getElementById("panel"), { request, repair, sessionKey: picker.value });
  picker.addEventListener("change", () => panel?.update({ sessionKey: picker.value }));
} catch (error) {
  status.textContent = `vilvona ui: ${error.message}`;
}
