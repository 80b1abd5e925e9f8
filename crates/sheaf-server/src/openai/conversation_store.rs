//! The conversations of OpenAI's Conversations API (`/v1/conversations`): each one's metadata
//! and its items, in the input items' form, oldest first. A response made with `conversation`
//! reads them before its own input, and adds its input and output items once it has finished.
//!
//! They are kept in memory, within a budget of bytes (the Responses API's
//! `--responses-store-mib`, counted apart from the responses): past it, the conversations used
//! least recently go first, and a request that names one gets a 404 saying so. A budget of 0
//! keeps none.

use std::sync::Mutex;

use serde_json::{json, Value};

use super::budget::Budgeted;

/// One conversation.
#[derive(Debug, Clone)]
pub struct Conversation {
    pub id: String,
    pub created_at: u64,
    pub metadata: Value,
    /// Its items, oldest first, each with an `id`.
    pub items: Vec<Value>,
}

impl Conversation {
    /// The `conversation` object.
    pub fn object(&self) -> Value {
        json!({
            "id": self.id,
            "object": "conversation",
            "created_at": self.created_at,
            "metadata": self.metadata,
        })
    }

    /// The bytes it is counted as.
    fn size(&self) -> usize {
        self.id.len()
            + self.metadata.to_string().len()
            + self
                .items
                .iter()
                .map(|i| i.to_string().len())
                .sum::<usize>()
    }
}

/// Why a change to the store was not made.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// No such conversation is kept.
    Unknown,
    /// It has no such item.
    NoItem,
    /// It would be larger than the whole budget.
    TooLarge,
}

/// The kept conversations, by id.
#[derive(Debug)]
pub struct ConversationStore {
    budget: usize,
    kept: Mutex<Budgeted<Conversation>>,
}

impl Default for ConversationStore {
    fn default() -> Self {
        ConversationStore::new(super::store::DEFAULT_MIB << 20)
    }
}

impl ConversationStore {
    /// A store of at most `budget` bytes (0: none is kept).
    pub fn new(budget: usize) -> ConversationStore {
        ConversationStore {
            budget,
            kept: Mutex::new(Budgeted::new(budget)),
        }
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Budgeted<Conversation>> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether anything is kept at all.
    pub fn enabled(&self) -> bool {
        self.budget > 0
    }

    /// A new conversation with `metadata` and `items`; its object.
    pub fn create(
        &self,
        created_at: u64,
        metadata: Value,
        items: Vec<Value>,
    ) -> Result<Value, Refused> {
        let conversation = Conversation {
            // Random, so that one client cannot read another's conversations by guessing.
            id: format!("conv_{:032x}", rand::random::<u128>()),
            created_at,
            metadata,
            items,
        };
        let object = conversation.object();
        put(&mut self.kept(), conversation)?;
        Ok(object)
    }

    /// The conversation `id`, marked as used.
    pub fn get(&self, id: &str) -> Option<Conversation> {
        self.kept().get(id).cloned()
    }

    /// Changes a conversation with `change`, which says what it answers; the conversation
    /// grown past the whole budget is refused and left as it was.
    fn change<T>(
        &self,
        id: &str,
        change: impl FnOnce(&mut Conversation) -> Result<T, Refused>,
    ) -> Result<T, Refused> {
        let mut kept = self.kept();
        let Some(conversation) = kept.get(id) else {
            return Err(Refused::Unknown);
        };
        let mut changed = conversation.clone();
        let answer = change(&mut changed)?;
        put(&mut kept, changed)?;
        Ok(answer)
    }

    /// Sets a conversation's metadata; its object.
    pub fn set_metadata(&self, id: &str, metadata: Value) -> Result<Value, Refused> {
        self.change(id, |c| {
            c.metadata = metadata;
            Ok(c.object())
        })
    }

    /// Adds `items` at a conversation's end.
    pub fn append(&self, id: &str, items: Vec<Value>) -> Result<(), Refused> {
        self.change(id, |c| {
            c.items.extend(items);
            Ok(())
        })
    }

    /// Removes item `item` from a conversation; the conversation's object.
    pub fn remove_item(&self, id: &str, item: &str) -> Result<Value, Refused> {
        self.change(id, |c| {
            let at = c
                .items
                .iter()
                .position(|i| i["id"] == item)
                .ok_or(Refused::NoItem)?;
            c.items.remove(at);
            Ok(c.object())
        })
    }

    /// Removes the conversation `id`; whether it was kept.
    pub fn remove(&self, id: &str) -> bool {
        self.kept().remove(id).is_some()
    }

    /// The bytes kept.
    pub fn bytes(&self) -> usize {
        self.kept().bytes()
    }
}

/// Keeps `conversation`, in place of the one of its id; one larger than the whole budget is
/// refused, and what was there stays.
fn put(kept: &mut Budgeted<Conversation>, conversation: Conversation) -> Result<(), Refused> {
    let size = conversation.size();
    match kept.put(conversation.id.clone(), conversation, size) {
        true => Ok(()),
        false => Err(Refused::TooLarge),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(id: &str, text: &str) -> Value {
        json!({ "id": id, "type": "message", "role": "user", "content": text })
    }

    #[test]
    fn a_conversation_is_made_read_changed_and_removed() {
        let store = ConversationStore::new(1 << 20);
        let made = store
            .create(7, json!({ "topic": "x" }), vec![item("msg_1", "hi")])
            .unwrap();
        let id = made["id"].as_str().unwrap().to_string();
        assert!(id.starts_with("conv_"));
        assert_eq!(made["object"], "conversation");
        assert_eq!(made["created_at"], 7);
        store.append(&id, vec![item("msg_2", "there")]).unwrap();
        let ids = |store: &ConversationStore| -> Vec<Value> {
            store
                .get(&id)
                .unwrap()
                .items
                .iter()
                .map(|i| i["id"].clone())
                .collect()
        };
        assert_eq!(ids(&store), ["msg_1", "msg_2"]);
        assert_eq!(
            store.set_metadata(&id, json!({ "topic": "y" })).unwrap()["metadata"]["topic"],
            "y"
        );
        assert_eq!(store.remove_item(&id, "msg_1").unwrap()["id"], id.as_str());
        assert_eq!(ids(&store), ["msg_2"]);
        assert_eq!(store.remove_item(&id, "msg_1"), Err(Refused::NoItem));
        assert_eq!(store.append("conv_none", Vec::new()), Err(Refused::Unknown));
        let before = store.bytes();
        assert!(before > 0);
        assert!(store.remove(&id));
        assert!(!store.remove(&id));
        assert_eq!(store.bytes(), 0);
    }

    #[test]
    fn the_least_recently_used_go_first_and_none_grows_past_the_budget() {
        let store = ConversationStore::new(600);
        let a = store
            .create(0, json!({}), vec![item("msg_a", &"a".repeat(200))])
            .unwrap();
        let b = store
            .create(0, json!({}), vec![item("msg_b", &"b".repeat(200))])
            .unwrap();
        let (a, b) = (a["id"].as_str().unwrap(), b["id"].as_str().unwrap());
        // `a` used last: `b` goes when `c` comes.
        assert!(store.get(a).is_some());
        let c = store
            .create(0, json!({}), vec![item("msg_c", &"c".repeat(200))])
            .unwrap();
        assert!(store.get(b).is_none());
        assert!(store.get(a).is_some() && store.get(c["id"].as_str().unwrap()).is_some());
        assert!(store.bytes() <= 600);
        // A conversation that would outgrow the whole budget is refused and left as it was.
        let big = vec![item("msg_d", &"d".repeat(700))];
        assert_eq!(store.append(a, big.clone()), Err(Refused::TooLarge));
        assert_eq!(store.get(a).unwrap().items.len(), 1);
        assert_eq!(store.create(0, json!({}), big), Err(Refused::TooLarge));
        let off = ConversationStore::new(0);
        assert!(!off.enabled());
    }
}
