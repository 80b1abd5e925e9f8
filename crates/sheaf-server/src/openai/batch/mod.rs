//! OpenAI's Batch API: files of requests run in the background, answered in files.
//!
//! - [`files`]: the Files API (`/v1/files`), where batch files are uploaded and answers kept;
//! - [`runs`]: the Batch API (`/v1/batches`), each batch run in the background;
//! - [`line`]: a request line and its output line, checked and answered through the `/v1`
//!   routes in process (shared with `sheaf run`).

pub mod files;
pub mod line;
pub mod runs;
