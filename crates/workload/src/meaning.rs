//! Facts stated once and asked about in other words: the evaluation of recall by meaning.
//!
//! Each probe is a statement a user makes in passing and a question about it that shares no
//! content word with it ("painting helps me relax" / "what does the user do to unwind?"), as
//! people ask weeks later. Some are in Chinese and Japanese. Text search finds a probe only
//! through a word both happen to share; search by meaning should find most.

/// A statement and a question about it in other words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probe {
    pub statement: &'static str,
    pub question: &'static str,
}

/// The probes, in the order they are planted.
pub const PROBES: &[Probe] = &[
    Probe {
        statement: "Painting watercolours in the evening helps me relax after long days.",
        question: "What does the user do to unwind?",
    },
    Probe {
        statement: "My daughter starts kindergarten next September.",
        question: "When does the child begin school?",
    },
    Probe {
        statement: "I'm allergic to peanuts, so keep them out of any recipe.",
        question: "Which food causes a bad reaction?",
    },
    Probe {
        statement: "We adopted a golden retriever puppy named Biscuit.",
        question: "What kind of dog did they get?",
    },
    Probe {
        statement: "The flight to Lisbon leaves at dawn on Friday.",
        question: "When is the trip to Portugal departing?",
    },
    Probe {
        statement: "My grandmother taught me to bake sourdough bread.",
        question: "Who showed the user how to make loaves?",
    },
    Probe {
        statement: "I sprained my ankle jogging along the river.",
        question: "How was the foot injured?",
    },
    Probe {
        statement: "Our landlord raised the rent by twelve percent.",
        question: "How much more does the apartment cost now?",
    },
    Probe {
        statement: "I switched to decaf because caffeine keeps me awake.",
        question: "Why did the user stop drinking regular coffee?",
    },
    Probe {
        statement: "My brother is getting married in Kyoto in spring.",
        question: "Where is the sibling's wedding?",
    },
    Probe {
        statement: "The car's brakes squeal whenever it rains.",
        question: "What noise does the vehicle make in wet weather?",
    },
    Probe {
        statement: "I'm learning the cello from online lessons.",
        question: "Which musical instrument is the user studying?",
    },
    Probe {
        statement: "My manager approved four weeks of parental leave.",
        question: "How long is the time off for the new baby?",
    },
    Probe {
        statement: "I volunteer at the animal shelter on Sundays.",
        question: "Where does the user help out at weekends?",
    },
    Probe {
        statement: "The dentist found two cavities at my checkup.",
        question: "What did the teeth appointment reveal?",
    },
    Probe {
        statement: "We planted tomatoes and basil in the backyard garden.",
        question: "Which vegetables and herbs are growing outside?",
    },
    Probe {
        statement: "I run a marathon every autumn to raise money for charity.",
        question: "What race does the user do for fundraising?",
    },
    Probe {
        statement: "My laptop battery dies after barely an hour.",
        question: "Why can't the computer last long unplugged?",
    },
    Probe {
        statement: "I grew up on a sheep farm in New Zealand.",
        question: "Where did the user spend their childhood?",
    },
    Probe {
        statement: "The neighbours throw loud parties every weekend.",
        question: "What disturbs the user at home on Saturdays?",
    },
    Probe {
        statement: "I'm saving up for a house deposit.",
        question: "What is the user putting money aside to buy?",
    },
    Probe {
        statement: "My favourite novel is about a whaling voyage.",
        question: "Which book does the user love most?",
    },
    Probe {
        statement: "I get migraines when I stare at screens too long.",
        question: "What causes the user's headaches?",
    },
    Probe {
        statement: "We celebrate our anniversary with a picnic by the lake.",
        question: "How does the couple mark the date they met?",
    },
    Probe {
        statement: "My sister works as a nurse in the emergency ward.",
        question: "What is the sibling's job at the hospital?",
    },
    Probe {
        statement: "I quit smoking three years ago.",
        question: "When did the user give up cigarettes?",
    },
    Probe {
        statement: "The basement flooded during the storm last month.",
        question: "What happened below the house in the bad weather?",
    },
    Probe {
        statement: "I meditate for twenty minutes each morning.",
        question: "What calming routine does the user start the day with?",
    },
    Probe {
        statement: "Our team won the office trivia night.",
        question: "Which quiz competition did the colleagues take first place in?",
    },
    Probe {
        statement: "I'm vegetarian but I still eat eggs and cheese.",
        question: "What is the user's diet?",
    },
    Probe {
        statement: "My son broke his arm falling off a skateboard.",
        question: "How did the boy get hurt?",
    },
    Probe {
        statement: "I commute by bicycle even in winter.",
        question: "How does the user travel to work?",
    },
    Probe {
        statement: "The wifi drops every evening around nine.",
        question: "When does the internet connection fail?",
    },
    Probe {
        statement: "I speak Portuguese because my mother is Brazilian.",
        question: "Which language did the user learn from a parent?",
    },
    Probe {
        statement: "We're renovating the kitchen and the cabinets arrive Tuesday.",
        question: "When will the cupboards be delivered?",
    },
    Probe {
        statement: "I have a fear of heights, so no rooftop restaurants.",
        question: "What phobia should dinner plans avoid?",
    },
    Probe {
        statement: "My cat only eats salmon flavoured food.",
        question: "What does the pet insist on for meals?",
    },
    Probe {
        statement: "I play five-a-side football on Thursday nights.",
        question: "Which sport does the user do midweek?",
    },
    Probe {
        statement: "The pharmacy closes early on public holidays.",
        question: "When does the chemist shut sooner than usual?",
    },
    Probe {
        statement: "I lost my wallet on the train yesterday.",
        question: "What went missing during the commute?",
    },
    Probe {
        statement: "我每天早上喝绿茶，不喝咖啡。",
        question: "用户早餐时习惯喝什么饮料？",
    },
    Probe {
        statement: "我的女儿下个月要去北京上大学。",
        question: "孩子什么时候去首都读书？",
    },
    Probe {
        statement: "我们家养了一只白色的小猫。",
        question: "他们有什么宠物？",
    },
    Probe {
        statement: "週末はいつも山に登ってリフレッシュしています。",
        question: "休みの日には何をして気分転換しますか？",
    },
    Probe {
        statement: "来月から大阪の新しい会社で働き始めます。",
        question: "いつ転職しますか？",
    },
    Probe {
        statement: "我对海鲜过敏，吃虾会起疹子。",
        question: "用户不能吃哪种食物？",
    },
];

/// A probe planted in a session: the turn whose user message states it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Planted {
    pub turn: usize,
    pub probe: Probe,
}

/// Appends each probe's statement to the user message of a turn, the probes spread evenly over
/// the session (the first after a tenth of it: there is history before each, and after).
pub fn plant(workload: &mut crate::Workload, probes: &[Probe]) -> Vec<Planted> {
    let turns = workload.turns.len();
    if turns == 0 || probes.is_empty() {
        return Vec::new();
    }
    let mut planted = Vec::with_capacity(probes.len());
    for (index, probe) in probes.iter().enumerate() {
        let turn = (turns / 10 + index * (turns - turns / 10) / probes.len()).min(turns - 1);
        let entry = &mut workload.entries[workload.turns[turn].start];
        let mut message = serde_json::to_value(&entry.message).unwrap_or_default();
        if let Some(text) = message["content"].as_str() {
            message["content"] = serde_json::Value::String(format!("{text} {}", probe.statement));
        }
        if let Ok(stated) = serde_json::from_value(message) {
            entry.message = stated;
        }
        planted.push(Planted {
            turn,
            probe: *probe,
        });
    }
    planted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_probe_is_stated_once_in_its_turn() {
        let mut workload = crate::generate(200, 7, 0);
        let planted = plant(&mut workload, PROBES);
        assert_eq!(planted.len(), PROBES.len());
        let text = workload.to_jsonl();
        for Planted { turn, probe } in &planted {
            assert_eq!(
                text.matches(probe.statement).count(),
                1,
                "{}",
                probe.statement
            );
            let user =
                serde_json::to_string(&workload.entries[workload.turns[*turn].start].message)
                    .unwrap();
            assert!(user.contains(probe.statement));
        }
    }
}
