//! OpenAI's Conversations API, which keeps a conversation's items on the server for the
//! Responses API (`conversation` on `POST /v1/responses`; the OpenAI Agents SDK's
//! `OpenAIConversationsSession`): `POST /v1/conversations` makes one (its first items, up to 20,
//! and `metadata`), `GET`, `POST` (new metadata) and `DELETE /v1/conversations/{id}` read,
//! change and remove it, `GET /v1/conversations/{id}/items` lists its items a page at a time,
//! `POST` there adds up to 20, and `GET`/`DELETE .../items/{item_id}` read and remove one.
//!
//! Items are read as a response's input is, and refused (400) when a response could not read
//! them: messages with text parts, function calls and their outputs. Each gets an id where it
//! has none. The conversations live in [`super::conversation_store`].

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Map, Value};

use super::conversation_store::{ConversationStore, Refused};
use super::handlers::now_s;
use super::responses::{input_message, listed, Page};
use crate::error::{bad, OpenAiError};
use crate::AppState;

/// Most items one request adds, as OpenAI's.
const MOST_ITEMS: usize = 20;

/// `POST /v1/conversations`.
pub async fn create(
    State(state): State<AppState>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, OpenAiError> {
    let Json(body) = body.map_err(|e| bad(e.body_text()))?;
    let store = &state.conversations;
    if !store.enabled() {
        return Err(bad(
            "this server keeps no conversations (--responses-store-mib 0); send the whole \
             conversation in a response's input",
        ));
    }
    let mut fields = fields(body, &["items", "metadata"])?;
    let items = match fields.remove("items") {
        None | Some(Value::Null) => Vec::new(),
        Some(items) => checked_items(items)?,
    };
    let metadata =
        checked_metadata(fields.remove("metadata").unwrap_or(Value::Null)).map_err(bad)?;
    store
        .create(now_s(), metadata, items)
        .map(Json)
        .map_err(|e| refused(store, "", e))
}

/// `GET /v1/conversations/{id}`.
pub async fn get(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, OpenAiError> {
    match state.conversations.get(&id) {
        Some(conversation) => Ok(Json(conversation.object())),
        None => Err(unknown(&state.conversations, &id)),
    }
}

/// `POST /v1/conversations/{id}`: its metadata replaced.
pub async fn update(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, OpenAiError> {
    let Json(body) = body.map_err(|e| bad(e.body_text()))?;
    let mut fields = fields(body, &["metadata"])?;
    let Some(metadata) = fields.remove("metadata") else {
        return Err(bad(
            "metadata: the conversation's new metadata, which is required",
        ));
    };
    let metadata = checked_metadata(metadata).map_err(bad)?;
    let store = &state.conversations;
    store
        .set_metadata(&id, metadata)
        .map(Json)
        .map_err(|e| refused(store, &id, e))
}

/// `DELETE /v1/conversations/{id}`.
pub async fn delete(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, OpenAiError> {
    if !state.conversations.remove(&id) {
        return Err(unknown(&state.conversations, &id));
    }
    Ok(Json(
        json!({ "id": id, "object": "conversation.deleted", "deleted": true }),
    ))
}

/// `GET /v1/conversations/{id}/items`: a page of its items, `limit` (1 to 100, 20 by default),
/// `order` (`desc`, the default, or `asc`), `after` (an item's id).
pub async fn items(
    State(state): State<AppState>,
    Path(id): Path<String>,
    page: Result<Query<Page>, QueryRejection>,
) -> Result<Json<Value>, OpenAiError> {
    let Query(page) = page.map_err(|e| bad(e.body_text()))?;
    let Some(conversation) = state.conversations.get(&id) else {
        return Err(unknown(&state.conversations, &id));
    };
    page.of(&conversation.items).map(Json).map_err(bad)
}

/// `POST /v1/conversations/{id}/items`: `items` (1 to 20) added at its end; the list of them,
/// with their ids.
pub async fn add_items(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, OpenAiError> {
    let Json(body) = body.map_err(|e| bad(e.body_text()))?;
    let mut fields = fields(body, &["items"])?;
    let items = checked_items(fields.remove("items").unwrap_or(Value::Null))?;
    if items.is_empty() {
        return Err(bad("items: at least one item to add"));
    }
    let store = &state.conversations;
    store
        .append(&id, items.clone())
        .map_err(|e| refused(store, &id, e))?;
    Ok(Json(json!({
        "object": "list",
        "data": items,
        "first_id": items.first().map(|i| &i["id"]),
        "last_id": items.last().map(|i| &i["id"]),
        "has_more": false,
    })))
}

/// `GET /v1/conversations/{id}/items/{item_id}`.
pub async fn item(
    State(state): State<AppState>,
    Path((id, item_id)): Path<(String, String)>,
) -> Result<Json<Value>, OpenAiError> {
    let store = &state.conversations;
    let Some(conversation) = store.get(&id) else {
        return Err(unknown(store, &id));
    };
    match conversation
        .items
        .iter()
        .find(|i| i["id"] == item_id.as_str())
    {
        Some(item) => Ok(Json(item.clone())),
        None => Err(no_item(&id, &item_id)),
    }
}

/// `DELETE /v1/conversations/{id}/items/{item_id}`: the conversation's object.
pub async fn delete_item(
    State(state): State<AppState>,
    Path((id, item_id)): Path<(String, String)>,
) -> Result<Json<Value>, OpenAiError> {
    let store = &state.conversations;
    match store.remove_item(&id, &item_id) {
        Ok(object) => Ok(Json(object)),
        Err(Refused::NoItem) => Err(no_item(&id, &item_id)),
        Err(e) => Err(refused(store, &id, e)),
    }
}

/// The body's fields, of which only `known` are taken.
fn fields(body: Value, known: &[&str]) -> Result<Map<String, Value>, OpenAiError> {
    let Value::Object(fields) = body else {
        return Err(bad(format!(
            "the body is a JSON object with {}",
            known.join(", ")
        )));
    };
    if let Some(other) = fields.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(bad(format!(
            "{}: not a field of this request (it takes {})",
            sheaf_core::clip(other),
            known.join(", ")
        )));
    }
    Ok(fields)
}

/// Items to add, as a response would read them, each with an id.
fn checked_items(items: Value) -> Result<Vec<Value>, OpenAiError> {
    let Value::Array(items) = items else {
        return Err(bad(
            "items: a list of items (messages, function calls, their outputs)",
        ));
    };
    if items.len() > MOST_ITEMS {
        return Err(bad(format!(
            "items: at most {MOST_ITEMS} at a time, not {}",
            items.len()
        )));
    }
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            input_message(i, item.clone())
                .map_err(|e| bad(format!("items: {e}")))
                .map(|_| listed(item))
        })
        .collect()
}

/// Metadata as OpenAI takes it, on a conversation or a response: at most 16 keys of at most 64
/// characters, each a string of at most 512.
pub(super) fn checked_metadata(metadata: Value) -> Result<Value, String> {
    let fields = match metadata {
        Value::Null => return Ok(json!({})),
        Value::Object(fields) => fields,
        _ => return Err("metadata: an object of strings".into()),
    };
    if fields.len() > 16 {
        return Err(format!("metadata: at most 16 keys, not {}", fields.len()));
    }
    for (key, value) in &fields {
        if key.chars().count() > 64 {
            return Err(format!(
                "metadata: a key of at most 64 characters, not '{}'",
                sheaf_core::clip(key)
            ));
        }
        match value {
            Value::String(s) if s.chars().count() <= 512 => {}
            Value::String(_) => {
                return Err(format!(
                    "metadata.{}: at most 512 characters",
                    sheaf_core::clip(key)
                ))
            }
            _ => return Err(format!("metadata.{}: a string", sheaf_core::clip(key))),
        }
    }
    Ok(Value::Object(fields))
}

/// The 404 of a conversation not kept, saying why it may not be.
pub(super) fn unknown(store: &ConversationStore, id: &str) -> OpenAiError {
    let why = if store.enabled() {
        "unknown, deleted, or let go to stay within --responses-store-mib"
    } else {
        "this server keeps no conversations (--responses-store-mib 0)"
    };
    OpenAiError::new(
        StatusCode::NOT_FOUND,
        format!("no conversation '{}' is kept: {why}", sheaf_core::clip(id)),
    )
}

fn no_item(id: &str, item: &str) -> OpenAiError {
    OpenAiError::new(
        StatusCode::NOT_FOUND,
        format!(
            "conversation '{}' has no item '{}'",
            sheaf_core::clip(id),
            sheaf_core::clip(item)
        ),
    )
}

/// What a refused change is answered with.
fn refused(store: &ConversationStore, id: &str, why: Refused) -> OpenAiError {
    match why {
        Refused::Unknown | Refused::NoItem => unknown(store, id),
        Refused::TooLarge => OpenAiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "the conversation would be larger than this server keeps \
             (--responses-store-mib)",
        ),
    }
}
