//! OpenAI's Batch API: files of requests run in the background, answered in files.
//!
//! - [`line`]: a request line and its output line, checked and answered through the `/v1`
//!   routes in process (shared with `sheaf run`);

pub mod line;
