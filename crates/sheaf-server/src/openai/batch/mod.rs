//! OpenAI's Batch API: files of requests run in the background, answered in files.
//!
//! - [`files`]: the Files API (`/v1/files`), where batch files are uploaded and answers kept;
//! - [`runs`]: the Batch API (`/v1/batches`), each batch run in the background;
//! - [`line`]: a request line and its output line, checked and answered through the `/v1`
//!   routes in process (shared with `sheaf run`).

pub mod files;
pub mod line;
pub mod runs;

use serde_json::{json, Value};

/// A page of a list, as OpenAI's list routes answer: `objects` (each with its `id`), and
/// whether more follow.
fn page(objects: Vec<Value>, has_more: bool) -> Value {
    let id = |o: Option<&Value>| o.map(|o| o["id"].clone());
    json!({
        "object": "list",
        "first_id": id(objects.first()),
        "last_id": id(objects.last()),
        "has_more": has_more,
        "data": objects,
    })
}
