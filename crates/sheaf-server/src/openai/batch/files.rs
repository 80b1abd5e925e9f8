//! OpenAI's Files API for batches: `POST /v1/files` (a multipart upload with `purpose:
//! batch`), `GET /v1/files`, `GET`/`DELETE /v1/files/{id}` and `GET /v1/files/{id}/content`.
//!
//! Files live on disk, in `--files-dir` (default: a temporary folder made at the first upload
//! and removed with the server), within a budget of bytes (`--files-store-mib`) that uploads
//! and batches' output files share: an upload past it is refused with 413, and a batch whose
//! answers would pass it fails. An upload is a request like any other: no larger than the HTTP
//! body limit (`--max-body-bytes`), and held in memory until it is on disk. A budget of 0
//! refuses the Files API, and so the Batch API.
//!
//! In a folder given (`--files-dir`), each file `file-N` has its description beside it
//! (`file-N.json`), written once the data is whole, and the next server on the same folder
//! reads the files back ([`FileStore::open`]): the same ids, listed as before, and new files
//! numbered after them. Data without a description is a file that was still being written when
//! a server stopped (an upload, a batch's answers), and is removed. The data reaches the disk
//! before its description, and a description is written whole and synced ([`write_whole`]),
//! so a power cut cannot leave a description of data that is not there.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use axum::extract::multipart::{Field, MultipartRejection};
use axum::extract::{Multipart, Path as UrlPath, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

use crate::durable::write_whole;
use crate::error::{bad, OpenAiError};
use crate::openai::handlers::now_s;
use crate::AppState;

/// The default budget, in MiB.
pub const DEFAULT_MIB: usize = 1024;

/// The purposes of uploads, and of batches' answers.
pub const BATCH: &str = "batch";
pub const BATCH_OUTPUT: &str = "batch_output";

/// One file's description, as the API gives it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FileMeta {
    pub id: String,
    pub bytes: u64,
    pub created_at: u64,
    pub filename: String,
    pub purpose: String,
}

impl FileMeta {
    /// OpenAI's File object.
    pub fn json(&self) -> Value {
        json!({
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "expires_at": null,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": null,
        })
    }
}

/// Where the files are: a folder of the server's own, or one it was given.
#[derive(Debug)]
enum Folder {
    Temporary(tempfile::TempDir),
    Given(PathBuf),
}

impl Folder {
    fn path(&self) -> &Path {
        match self {
            Folder::Temporary(dir) => dir.path(),
            Folder::Given(dir) => dir,
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    folder: Option<Folder>,
    /// The files, by number (`file-N`): in the order they were made.
    files: BTreeMap<u64, FileMeta>,
    /// Bytes held: the files', and those reserved by uploads and answers being written.
    used: u64,
    next: u64,
}

/// The files, on disk, within a budget.
#[derive(Debug)]
pub struct FileStore {
    limit: u64,
    given: Option<PathBuf>,
    inner: Mutex<Inner>,
}

impl Default for FileStore {
    fn default() -> FileStore {
        FileStore::new(None, (DEFAULT_MIB as u64) << 20)
    }
}

/// A file being written: its number and path, and the bytes reserved for it so far.
#[derive(Debug)]
pub struct NewFile {
    n: u64,
    pub path: PathBuf,
    reserved: u64,
}

impl FileStore {
    /// Files in `dir` (none: a temporary folder), at most `limit` bytes of them.
    pub fn new(dir: Option<PathBuf>, limit: u64) -> FileStore {
        FileStore {
            limit,
            given: dir,
            inner: Mutex::default(),
        }
    }

    /// Files in `dir`, made if need be, with those an earlier server left there; at most
    /// `limit` bytes of new ones while they hold more.
    pub fn open(dir: PathBuf, limit: u64) -> std::io::Result<FileStore> {
        std::fs::create_dir_all(&dir)?;
        let (files, next) = read_back(&dir)?;
        let used = files.values().map(|m| m.bytes).sum();
        if !files.is_empty() {
            tracing::info!(files = files.len(), bytes = used, dir = %dir.display(), "files of /v1/files read back");
        }
        Ok(FileStore {
            limit,
            given: Some(dir.clone()),
            inner: Mutex::new(Inner {
                folder: Some(Folder::Given(dir)),
                files,
                used,
                next,
            }),
        })
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new file's number and path (the folder made on first use).
    pub fn create(&self) -> Result<NewFile, OpenAiError> {
        if self.limit == 0 {
            return Err(OpenAiError::new(
                StatusCode::FORBIDDEN,
                "files: this server keeps none (--files-store-mib 0)",
            ));
        }
        let mut inner = self.inner();
        if inner.folder.is_none() {
            let folder = match &self.given {
                Some(dir) => std::fs::create_dir_all(dir).map(|_| Folder::Given(dir.clone())),
                None => tempfile::Builder::new()
                    .prefix("sheaf-files")
                    .tempdir()
                    .map(Folder::Temporary),
            };
            let folder = folder.map_err(|e| {
                OpenAiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("files: no folder to keep them in: {e}"),
                )
            })?;
            inner.folder = Some(folder);
        }
        inner.next += 1;
        let n = inner.next;
        let path = match &inner.folder {
            Some(folder) => folder.path().join(format!("file-{n}")),
            None => PathBuf::new(),
        };
        Ok(NewFile {
            n,
            path,
            reserved: 0,
        })
    }

    /// Whether the files outlive the server: kept in a folder given, and read back by the next.
    pub fn kept(&self) -> bool {
        self.given.is_some()
    }

    /// Books `bytes` more for `file`, or says why the budget has no room.
    pub fn reserve(&self, file: &mut NewFile, bytes: u64) -> Result<(), String> {
        let mut inner = self.inner();
        if inner.used + bytes > self.limit {
            return Err(format!(
                "files: the server keeps at most {} MiB of files (--files-store-mib), and {} \
                 bytes of it are in use; delete files first",
                self.limit >> 20,
                inner.used
            ));
        }
        inner.used += bytes;
        file.reserved += bytes;
        Ok(())
    }

    /// Lists a written file as `filename`, for `purpose`.
    pub fn add(&self, file: NewFile, filename: &str, purpose: &str) -> FileMeta {
        let meta = FileMeta {
            id: format!("file-{}", file.n),
            bytes: file.reserved,
            created_at: now_s(),
            filename: filename.to_string(),
            purpose: purpose.to_string(),
        };
        if self.kept() {
            let described = serde_json::to_vec(&meta).map_err(std::io::Error::other);
            let path = file.path.with_file_name(format!("file-{}.json", file.n));
            if let Err(e) = described.and_then(|d| write_whole(&path, &d)) {
                tracing::warn!(file = %meta.id, error = %e, "a file's description was not written: the file is not read back at the next start");
            }
        }
        self.inner().files.insert(file.n, meta.clone());
        meta
    }

    /// Gives up a file being written: its bytes and its data.
    pub fn discard(&self, file: NewFile) {
        self.inner().used -= file.reserved;
        let _ = std::fs::remove_file(&file.path);
    }

    fn number(id: &str) -> Option<u64> {
        id.strip_prefix("file-")?.parse().ok()
    }

    /// The file `id` and its path.
    pub fn get(&self, id: &str) -> Option<(FileMeta, PathBuf)> {
        let n = Self::number(id)?;
        let inner = self.inner();
        let meta = inner.files.get(&n)?.clone();
        let path = inner.folder.as_ref()?.path().join(format!("file-{n}"));
        Some((meta, path))
    }

    /// Removes the file `id`, data and all.
    pub fn remove(&self, id: &str) -> Option<FileMeta> {
        let n = Self::number(id)?;
        let mut inner = self.inner();
        let meta = inner.files.remove(&n)?;
        inner.used -= meta.bytes;
        if let Some(folder) = &inner.folder {
            let _ = std::fs::remove_file(folder.path().join(format!("file-{n}.json")));
            let _ = std::fs::remove_file(folder.path().join(format!("file-{n}")));
        }
        Some(meta)
    }

    /// The files, newest first (or oldest first with `ascending`), of `purpose` where one is
    /// given, after the file `after`.
    fn list(&self, purpose: Option<&str>, after: Option<u64>, ascending: bool) -> Vec<FileMeta> {
        let inner = self.inner();
        let fits = |m: &&FileMeta| purpose.is_none_or(|p| m.purpose == p);
        match (ascending, after) {
            (true, Some(a)) => inner
                .files
                .range(a + 1..)
                .map(|(_, m)| m)
                .filter(fits)
                .cloned()
                .collect(),
            (true, None) => inner.files.values().filter(fits).cloned().collect(),
            (false, Some(a)) => inner
                .files
                .range(..a)
                .rev()
                .map(|(_, m)| m)
                .filter(fits)
                .cloned()
                .collect(),
            (false, None) => inner.files.values().rev().filter(fits).cloned().collect(),
        }
    }
}

/// The files an earlier server left in `dir`, by number, and the highest number it used.
/// Data without its description, a description without its data or of another size, and
/// leftovers of [`write_whole`] are removed.
fn read_back(dir: &Path) -> std::io::Result<(BTreeMap<u64, FileMeta>, u64)> {
    let mut data = BTreeMap::new();
    let mut described = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("file-")) else {
            continue;
        };
        if let Some(n) = rest.strip_suffix(".json") {
            if let Ok(n) = n.parse::<u64>() {
                described.push((n, entry.path()));
            }
        } else if let Some(n) = rest.strip_suffix(".partial") {
            if n.parse::<u64>().is_ok() {
                let _ = std::fs::remove_file(entry.path());
            }
        } else if let Ok(n) = rest.parse::<u64>() {
            data.insert(n, (entry.path(), entry.metadata()?.len()));
        }
    }
    let mut next = data.keys().copied().max().unwrap_or(0);
    let mut files = BTreeMap::new();
    for (n, path) in described {
        next = next.max(n);
        let meta = std::fs::read(&path)
            .ok()
            .and_then(|d| serde_json::from_slice::<FileMeta>(&d).ok());
        match (meta, data.get(&n)) {
            (Some(meta), Some((_, bytes)))
                if meta.id == format!("file-{n}") && meta.bytes == *bytes =>
            {
                files.insert(n, meta);
            }
            _ => {
                tracing::warn!(file = %path.display(), "a file's description does not match its data: both removed");
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    for (n, (path, _)) in data {
        if !files.contains_key(&n) {
            let _ = std::fs::remove_file(path);
        }
    }
    Ok((files, next))
}

/// `POST /v1/files`: a multipart form with `file` (the data, its name) and `purpose`, which
/// must be `batch`.
pub async fn upload(
    State(state): State<AppState>,
    form: Result<Multipart, MultipartRejection>,
) -> Result<Json<Value>, OpenAiError> {
    let mut form = form.map_err(|e| bad(format!("files: {}", e.body_text())))?;
    let store = &state.files;
    let mut purpose = None;
    let mut written: Option<(NewFile, String)> = None;
    let outcome = async {
        while let Some(field) = form.next_field().await.map_err(|e| bad(e.body_text()))? {
            match field.name() {
                Some("purpose") => {
                    purpose = Some(field.text().await.map_err(|e| bad(e.body_text()))?);
                }
                Some("file") if written.is_none() => {
                    let filename = field.file_name().unwrap_or("upload.jsonl").to_string();
                    let mut file = store.create()?;
                    let stored = save(store, &mut file, field).await;
                    written = Some((file, filename));
                    stored?;
                }
                Some("file") => return Err(bad("file: give one file an upload")),
                Some("expires_after") => {
                    // How long OpenAI keeps a file: here, until deleted (or until the server
                    // ends, in its temporary folder).
                    let _ = field.bytes().await.map_err(|e| bad(e.body_text()))?;
                }
                other => {
                    return Err(bad(format!(
                        "{}: not a field of a file upload; give `file` and `purpose`",
                        other.unwrap_or("a field without a name")
                    )))
                }
            }
        }
        match purpose.as_deref() {
            Some(BATCH) => Ok(()),
            Some(other) => Err(bad(format!(
                "purpose: '{other}'; this server takes files of purpose 'batch'"
            ))),
            None => Err(bad("purpose: missing; give 'batch'")),
        }
    }
    .await;
    match (outcome, written) {
        (Ok(()), Some((file, filename))) => Ok(Json(store.add(file, &filename, BATCH).json())),
        (Ok(()), None) => Err(bad(
            "file: missing; give the batch file as the form's `file`",
        )),
        (Err(e), written) => {
            if let Some((file, _)) = written {
                store.discard(file);
            }
            Err(e)
        }
    }
}

/// Writes an upload's parts to `file`, each booked first.
async fn save(
    store: &FileStore,
    file: &mut NewFile,
    mut field: Field<'_>,
) -> Result<(), OpenAiError> {
    let failed = |e: std::io::Error| {
        OpenAiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("files: cannot write the upload: {e}"),
        )
    };
    let mut out = tokio::fs::File::create(&file.path).await.map_err(failed)?;
    while let Some(chunk) = field.chunk().await.map_err(|e| bad(e.body_text()))? {
        store
            .reserve(file, chunk.len() as u64)
            .map_err(|m| OpenAiError::new(StatusCode::PAYLOAD_TOO_LARGE, m))?;
        out.write_all(&chunk).await.map_err(failed)?;
    }
    out.flush().await.map_err(failed)?;
    // In a folder given, the data is on the disk before the description that lists it.
    if store.kept() {
        out.sync_data().await.map_err(failed)?;
    }
    Ok(())
}

/// What `GET /v1/files` takes.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    purpose: Option<String>,
    limit: Option<usize>,
    after: Option<String>,
    order: Option<String>,
}

/// `GET /v1/files`: the files, newest first unless `order=asc`, `limit` of them (1 to 10,000,
/// the default), after the file `after`.
pub async fn list(
    State(state): State<AppState>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, OpenAiError> {
    let Query(query) = query.map_err(|e| bad(e.body_text()))?;
    let limit = query.limit.unwrap_or(10_000);
    if !(1..=10_000).contains(&limit) {
        return Err(bad(format!("limit: {limit}; give 1 to 10000")));
    }
    let ascending = match query.order.as_deref() {
        None | Some("desc") => false,
        Some("asc") => true,
        Some(other) => return Err(bad(format!("order: '{other}'; give asc or desc"))),
    };
    let after = match &query.after {
        None => None,
        Some(id) => {
            Some(FileStore::number(id).ok_or_else(|| bad(format!("after: '{id}' is no file id")))?)
        }
    };
    let all = state.files.list(query.purpose.as_deref(), after, ascending);
    let shown = all.iter().take(limit).map(FileMeta::json).collect();
    Ok(Json(super::page(shown, all.len() > limit)))
}

fn missing(id: &str) -> OpenAiError {
    OpenAiError::new(StatusCode::NOT_FOUND, format!("No such File object: {id}"))
}

/// `GET /v1/files/{id}`.
pub async fn get(
    State(state): State<AppState>,
    UrlPath(id): UrlPath<String>,
) -> Result<Json<Value>, OpenAiError> {
    let (meta, _) = state.files.get(&id).ok_or_else(|| missing(&id))?;
    Ok(Json(meta.json()))
}

/// `GET /v1/files/{id}/content`: the file's bytes.
pub async fn content(
    State(state): State<AppState>,
    UrlPath(id): UrlPath<String>,
) -> Result<Response, OpenAiError> {
    let (_, path) = state.files.get(&id).ok_or_else(|| missing(&id))?;
    // Removed while it was being read: as if it never was.
    let data = tokio::fs::read(&path).await.map_err(|_| missing(&id))?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], data).into_response())
}

/// `DELETE /v1/files/{id}`.
pub async fn delete(
    State(state): State<AppState>,
    UrlPath(id): UrlPath<String>,
) -> Result<Json<Value>, OpenAiError> {
    let meta = state.files.remove(&id).ok_or_else(|| missing(&id))?;
    Ok(Json(
        json!({"id": meta.id, "object": "file", "deleted": true}),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_holds_uploads_and_frees_what_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::open(dir.path().to_path_buf(), 100).unwrap();
        let mut a = store.create().unwrap();
        store.reserve(&mut a, 60).unwrap();
        std::fs::write(&a.path, [0u8; 60]).unwrap();
        let a = store.add(a, "a.jsonl", BATCH);
        let mut b = store.create().unwrap();
        let refused = store.reserve(&mut b, 41).unwrap_err();
        assert!(refused.contains("60 bytes of it are in use"), "{refused}");
        store.reserve(&mut b, 40).unwrap();
        store.discard(b);
        let mut c = store.create().unwrap();
        store.reserve(&mut c, 40).unwrap();
        let c = store.add(c, "c.jsonl", BATCH_OUTPUT);
        assert_eq!(store.get(&a.id).unwrap().0.bytes, 60);
        let ids = |l: Vec<FileMeta>| l.into_iter().map(|m| m.id).collect::<Vec<_>>();
        assert_eq!(
            ids(store.list(None, None, false)),
            [c.id.clone(), a.id.clone()]
        );
        assert_eq!(
            ids(store.list(Some(BATCH), None, true)),
            std::slice::from_ref(&a.id)
        );
        assert_eq!(
            ids(store.list(None, Some(3), false)),
            std::slice::from_ref(&a.id)
        );
        assert!(store.remove(&a.id).is_some());
        assert!(!dir.path().join("file-1").exists());
        assert!(store.get(&a.id).is_none() && store.remove(&a.id).is_none());
        let mut d = store.create().unwrap();
        store.reserve(&mut d, 60).unwrap();
        assert!(store.get("file-x").is_none() && store.get("nothing").is_none());
    }

    /// A file of `bytes` bytes written whole and listed.
    fn put(store: &FileStore, bytes: usize, purpose: &str) -> FileMeta {
        let mut file = store.create().unwrap();
        store.reserve(&mut file, bytes as u64).unwrap();
        std::fs::write(&file.path, vec![b'x'; bytes]).unwrap();
        store.add(file, "f.jsonl", purpose)
    }

    #[test]
    fn a_folder_given_is_read_back_by_the_next_store() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let store = FileStore::open(path.clone(), 1000).unwrap();
        let a = put(&store, 10, BATCH);
        let b = put(&store, 20, BATCH_OUTPUT);
        let c = put(&store, 30, BATCH);
        store.remove(&b.id).unwrap();
        // Stopped while writing: an upload's data without its description.
        let mut unfinished = store.create().unwrap();
        store.reserve(&mut unfinished, 5).unwrap();
        std::fs::write(&unfinished.path, b"xxxxx").unwrap();
        let unfinished = unfinished.path.clone();
        std::fs::write(path.join("file-99.partial"), b"{").unwrap();
        std::fs::write(path.join("notes.txt"), b"mine").unwrap();
        drop(store);

        let store = FileStore::open(path.clone(), 1000).unwrap();
        let ids = |l: Vec<FileMeta>| l.into_iter().map(|m| m.id).collect::<Vec<_>>();
        assert_eq!(
            ids(store.list(None, None, true)),
            [a.id.clone(), c.id.clone()]
        );
        let (meta, data) = store.get(&c.id).unwrap();
        assert_eq!((meta.bytes, meta.purpose.as_str()), (30, BATCH));
        assert_eq!(std::fs::read(data).unwrap().len(), 30);
        assert!(!unfinished.exists() && !path.join("file-99.partial").exists());
        assert!(
            path.join("notes.txt").exists(),
            "a file not the server's stays"
        );
        // New files are numbered after every file the earlier server made.
        let d = put(&store, 40, BATCH);
        assert_eq!(d.id, "file-5");
        // The bytes read back count against the budget.
        let mut e = store.create().unwrap();
        assert!(store.reserve(&mut e, 1000 - 80 + 1).is_err());
        store.reserve(&mut e, 1000 - 80).unwrap();
        store.discard(e);

        // A description whose data is gone, or of another size, goes with its data.
        std::fs::remove_file(path.join("file-1")).unwrap();
        std::fs::write(path.join("file-3"), b"short").unwrap();
        drop(store);
        let store = FileStore::open(path.clone(), 1000).unwrap();
        assert_eq!(
            ids(store.list(None, None, true)),
            std::slice::from_ref(&d.id)
        );
        assert!(!path.join("file-1.json").exists() && !path.join("file-3").exists());
    }

    #[test]
    fn a_store_of_no_bytes_takes_no_files() {
        let store = FileStore::new(None, 0);
        assert_eq!(store.create().unwrap_err().status, StatusCode::FORBIDDEN);
    }
}
