//! Triton's logging extension: the process's log settings, read and changed while it runs
//! (`GET`/`POST /v2/logging`, gRPC `LogSettings`, tritonclient's `get_log_settings` and
//! `update_log_settings`).
//!
//! The settings are Triton's: `log_info`, `log_warnings` and `log_errors` turn each level's
//! lines on or off on their own, `log_verbose_level` above 0 adds the server's debug lines (2
//! and above, its trace lines too), `log_file` and `log_format` say where and how lines are
//! written. The binary installs its subscriber with a filter that asks [`allows`] for each
//! line's level, and registers how to set the level its base filter (`--log-level`) lets
//! through for the server's own crates ([`install`]): the most verbose level the settings
//! turn on. Lines go to stderr, or, while `log_file` names a file (`--log-file` at start, or a
//! change while the server runs), are appended to that file ([`to_file`], [`file_line`]); the
//! file is opened when the setting is changed, so a path that cannot be written is refused then.
//! The format is set at start (`--log-format`): a change of it is refused, and naming the
//! current value is no change.

use std::borrow::Cow;
use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use sheaf_core::InferError;

static INFO: AtomicBool = AtomicBool::new(true);
static WARNINGS: AtomicBool = AtomicBool::new(true);
static ERRORS: AtomicBool = AtomicBool::new(true);
static VERBOSE: AtomicU32 = AtomicU32::new(0);
/// How the binary widens its base filter for a verbose level, and the format it writes.
static INSTALLED: OnceLock<Installed> = OnceLock::new();
/// Changes are made one at a time.
static CHANGING: Mutex<()> = Mutex::new(());
/// The file lines are appended to, as `log_file` names it; none: stderr.
static FILE: RwLock<Option<(String, Arc<File>)>> = RwLock::new(None);
/// Whether [`FILE`] holds a file, read for each line without the lock.
static TO_FILE: AtomicBool = AtomicBool::new(false);

struct Installed {
    format: &'static str,
    widest: Box<dyn Fn(tracing::Level) -> Result<(), String> + Send + Sync>,
}

/// Registers the subscriber the binary installed: its format's name (`default`, Triton's,
/// for text lines; `json`), the most verbose level its start-up filter lets through (the
/// settings start from it: the levels up to it on, and verbose level 1 for debug lines, 2 for
/// trace lines), and how to let the server's lines through up to a level.
pub fn install(
    format: &'static str,
    at_start: Option<tracing::Level>,
    widest: impl Fn(tracing::Level) -> Result<(), String> + Send + Sync + 'static,
) {
    use tracing::Level;
    let on = |level: Level| at_start.is_some_and(|s| s >= level);
    ERRORS.store(on(Level::ERROR), Ordering::Relaxed);
    WARNINGS.store(on(Level::WARN), Ordering::Relaxed);
    INFO.store(on(Level::INFO), Ordering::Relaxed);
    let verbose = match at_start {
        Some(Level::TRACE) => 2,
        Some(Level::DEBUG) => 1,
        _ => 0,
    };
    VERBOSE.store(verbose, Ordering::Relaxed);
    let _ = INSTALLED.set(Installed {
        format,
        widest: Box::new(widest),
    });
}

/// Whether a line of `level` is written under the current settings.
pub fn allows(level: &tracing::Level) -> bool {
    match *level {
        tracing::Level::ERROR => ERRORS.load(Ordering::Relaxed),
        tracing::Level::WARN => WARNINGS.load(Ordering::Relaxed),
        tracing::Level::INFO => INFO.load(Ordering::Relaxed),
        _ => VERBOSE.load(Ordering::Relaxed) > 0,
    }
}

/// Whether lines go to the `log_file` (else to stderr).
pub fn to_file() -> bool {
    TO_FILE.load(Ordering::Relaxed)
}

/// A writer of one line onto the `log_file`, for the subscriber's file layer (which writes only
/// while [`to_file`]); a line written after the file was unset is dropped.
pub fn file_line() -> FileLine {
    FileLine(
        FILE.read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|(_, file)| file.clone()),
    )
}

/// See [`file_line`].
pub struct FileLine(Option<Arc<File>>);

impl std::io::Write for FileLine {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match &self.0 {
            Some(file) => (&**file).write(buf),
            None => Ok(buf.len()),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match &self.0 {
            Some(file) => (&**file).flush(),
            None => Ok(()),
        }
    }
}

/// A setting's value as a request gives it.
#[derive(Debug, Clone, PartialEq)]
pub enum Setting<'a> {
    Bool(bool),
    Number(u64),
    Text(Cow<'a, str>),
}

impl Setting<'_> {
    fn shown(&self) -> String {
        match self {
            Setting::Bool(b) => b.to_string(),
            Setting::Number(n) => n.to_string(),
            Setting::Text(t) => format!("\"{t}\""),
        }
    }
}

/// The current settings, in Triton's order: `log_file`, `log_info`, `log_warnings`,
/// `log_errors`, `log_verbose_level`, `log_format`.
pub fn current() -> Vec<(&'static str, Setting<'static>)> {
    let format = INSTALLED.get().map_or("default", |i| i.format);
    let file = FILE.read().unwrap_or_else(|e| e.into_inner());
    let file = file.as_ref().map_or("", |(name, _)| name.as_str());
    vec![
        ("log_file", Setting::Text(file.to_string().into())),
        ("log_info", Setting::Bool(INFO.load(Ordering::Relaxed))),
        (
            "log_warnings",
            Setting::Bool(WARNINGS.load(Ordering::Relaxed)),
        ),
        ("log_errors", Setting::Bool(ERRORS.load(Ordering::Relaxed))),
        (
            "log_verbose_level",
            Setting::Number(u64::from(VERBOSE.load(Ordering::Relaxed))),
        ),
        ("log_format", Setting::Text(format.into())),
    ]
}

/// Applies `changes`, all or none: each is checked first (a name Triton does not have, a value
/// of the wrong kind, or a change of where or how lines are written is a 400 naming it).
pub fn update<'a>(
    changes: impl IntoIterator<Item = (&'a str, Setting<'a>)>,
) -> Result<(), InferError> {
    let _one = CHANGING.lock().unwrap_or_else(|e| e.into_inner());
    let format = INSTALLED.get().map_or("default", |i| i.format);
    let mut flags = Vec::new();
    let mut verbose = None;
    // The file a change names, opened now: a path that cannot be written is refused.
    let mut file = None;
    for (name, value) in changes {
        let shown = value.shown();
        let wrong = |kind: &str| {
            InferError::invalid(format!("log setting '{name}' takes {kind}, not {shown}"))
        };
        match (name, value) {
            ("log_info", Setting::Bool(b)) => flags.push((&INFO, b)),
            ("log_warnings", Setting::Bool(b)) => flags.push((&WARNINGS, b)),
            ("log_errors", Setting::Bool(b)) => flags.push((&ERRORS, b)),
            ("log_info" | "log_warnings" | "log_errors", _) => return Err(wrong("true or false")),
            ("log_verbose_level", Setting::Number(n)) => {
                verbose = Some(u32::try_from(n).map_err(|_| wrong("a level up to 4294967295"))?)
            }
            ("log_verbose_level", _) => return Err(wrong("a number")),
            ("log_file", Setting::Text(path)) => file = Some(open_log_file(&path)?),
            ("log_file", _) => return Err(wrong("a file's path, or \"\" for stderr")),
            // Text lines carry ISO 8601 stamps: Triton's name for that format names it too.
            ("log_format", Setting::Text(f))
                if f == format || (format, &*f) == ("default", "ISO8601") => {}
            ("log_format", _) => {
                return Err(InferError::invalid(format!(
                    "log setting 'log_format': the format is set at start (--log-format); \
                     this server writes '{format}'"
                )))
            }
            _ => {
                return Err(InferError::invalid(format!(
                    "unknown log setting '{name}'; the settings are log_file, log_info, \
                     log_warnings, log_errors, log_verbose_level and log_format"
                )))
            }
        }
    }
    let after = |flag: &'static AtomicBool| {
        flags
            .iter()
            .rev()
            .find(|(f, _)| std::ptr::eq(*f, flag))
            .map_or_else(|| flag.load(Ordering::Relaxed), |(_, on)| *on)
    };
    let level = verbose.unwrap_or_else(|| VERBOSE.load(Ordering::Relaxed));
    let widest = match level {
        0 if after(&INFO) => Some(tracing::Level::INFO),
        0 if after(&WARNINGS) => Some(tracing::Level::WARN),
        0 if after(&ERRORS) => Some(tracing::Level::ERROR),
        0 => None,
        1 => Some(tracing::Level::DEBUG),
        _ => Some(tracing::Level::TRACE),
    };
    if let Some(installed) = INSTALLED.get() {
        // No level on at all: the filter keeps the errors' level, and `allows` drops them.
        (installed.widest)(widest.unwrap_or(tracing::Level::ERROR)).map_err(|e| {
            InferError::new(
                sheaf_core::ErrorKind::Internal,
                format!("the log settings could not be applied: {e}"),
            )
        })?;
    }
    VERBOSE.store(level, Ordering::Relaxed);
    for (flag, on) in flags {
        flag.store(on, Ordering::Relaxed);
    }
    // The same path again opens it again: a file moved away (rotated) is started anew.
    if let Some(file) = file {
        let mut set = FILE.write().unwrap_or_else(|e| e.into_inner());
        TO_FILE.store(file.is_some(), Ordering::Relaxed);
        *set = file;
    }
    Ok(())
}

/// The file `path` names, opened to append lines to (created if it is not there); none for
/// `""`, stderr.
fn open_log_file(path: &str) -> Result<Option<(String, Arc<File>)>, InferError> {
    if path.is_empty() {
        return Ok(None);
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| {
            InferError::invalid(format!(
                "log setting 'log_file': cannot open '{}' to write: {e}",
                sheaf_core::clip(path)
            ))
        })?;
    Ok(Some((path.to_string(), Arc::new(file))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_change_all_or_none_and_bad_ones_are_named() {
        let get = |name: &str| current().into_iter().find(|(n, _)| *n == name).unwrap().1;
        update([
            ("log_info", Setting::Bool(false)),
            ("log_verbose_level", Setting::Number(1)),
        ])
        .unwrap();
        assert_eq!(get("log_info"), Setting::Bool(false));
        assert_eq!(get("log_verbose_level"), Setting::Number(1));
        assert!(!allows(&tracing::Level::INFO) && allows(&tracing::Level::DEBUG));
        assert!(allows(&tracing::Level::ERROR));
        // One bad change: nothing changes.
        let e = update([
            ("log_info", Setting::Bool(true)),
            ("log_errors", Setting::Number(1)),
        ])
        .unwrap_err();
        assert!(
            e.message
                .contains("'log_errors' takes true or false, not 1"),
            "{}",
            e.message
        );
        assert_eq!(get("log_info"), Setting::Bool(false));
        let e = update([("log_level", Setting::Number(1))]).unwrap_err();
        assert!(
            e.message.contains("unknown log setting 'log_level'"),
            "{}",
            e.message
        );
        let e = update([(
            "log_file",
            Setting::Text("/nonexistent/folder/x.log".into()),
        )])
        .unwrap_err();
        assert!(e.message.contains("cannot open"), "{}", e.message);
        assert!(!to_file());
        let e = update([("log_format", Setting::Text("json".into()))]).unwrap_err();
        assert!(e.message.contains("--log-format"), "{}", e.message);
        // Triton's name for text lines stamped in ISO 8601 names the text format.
        update([("log_format", Setting::Text("ISO8601".into()))]).unwrap();
        update([
            ("log_info", Setting::Bool(true)),
            ("log_verbose_level", Setting::Number(0)),
            ("log_file", Setting::Text("".into())),
            ("log_format", Setting::Text("default".into())),
        ])
        .unwrap();
        assert!(allows(&tracing::Level::INFO) && !allows(&tracing::Level::DEBUG));

        // A file: lines are appended to it, what it held kept; "" sends them to stderr again.
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sheaf.log");
        std::fs::write(&path, "before\n").unwrap();
        let named = path.to_str().unwrap();
        update([("log_file", Setting::Text(named.into()))]).unwrap();
        assert!(to_file());
        assert_eq!(get("log_file"), Setting::Text(named.into()));
        file_line().write_all(b"one line\n").unwrap();
        update([("log_file", Setting::Text("".into()))]).unwrap();
        assert!(!to_file());
        assert_eq!(get("log_file"), Setting::Text("".into()));
        file_line().write_all(b"dropped\n").unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "before\none line\n"
        );
    }
}
