//! Whether one instance of a Python model can serve now: its process is running, and the
//! model's own `is_ready()` (Triton's Python API; a module-level `def is_ready()` in sheaf's
//! batched API) says yes.
//!
//! The question reaches the model while a batch may be running, so it does not go through the
//! pipes that carry batches: a process whose model defines `is_ready()` listens on a Unix
//! socket of its own, which the server connects to once the model has loaded. Each question
//! is a line `{"id": N}`, each answer `{"id": N, "ready": true|false}` or
//! `{"id": N, "error": "..."}`, and a thread of the process answers them one at a time. As
//! under Triton: an answer not back within [`READY_TIMEOUT`] is not ready; one question is out
//! at a time, and a check that finds one out waits for its answer and takes it as its own; a
//! model without `is_ready()` costs nothing to ask.

use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::Value;
use sheaf_backend::ReadyCheck;

/// The longest the model's `is_ready()` may take to answer (Triton's five seconds).
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest answer line taken from the process.
const MAX_LINE: usize = 64 << 10;

/// One instance's readiness, shared by its model (which says when its process is lost and
/// when one is up again) and the server's readiness routes (which ask).
#[derive(Default)]
pub(crate) struct ReadyWatch {
    state: Mutex<State>,
    /// Signalled when a question's answer has come (or given up on).
    answered: Condvar,
}

#[derive(Default)]
struct State {
    /// Counts the processes the instance has had, so that a line taken out for a question goes
    /// back only if its process is still the instance's.
    process: u64,
    /// Why the instance cannot serve now; `None` while its process runs.
    down: Option<String>,
    /// The line to the running process's `is_ready()`: none when the model has none, or while
    /// a question is out on it (`asking`).
    line: Option<Line>,
    asking: bool,
    /// The last answer, and when it came.
    last: Option<(Instant, Result<(), String>)>,
}

/// The server's end of a process's readiness socket.
pub(crate) struct Line {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    /// The bytes of an answer read in part when a question gave up waiting.
    pending: Vec<u8>,
    next: u64,
}

impl Line {
    /// Connects to the socket the process listens on at `path`, and removes its name.
    pub(crate) fn connect(path: &Path) -> std::io::Result<Line> {
        let stream = UnixStream::connect(path);
        let _ = std::fs::remove_file(path);
        let writer = stream?;
        Ok(Line {
            reader: BufReader::new(writer.try_clone()?),
            writer,
            pending: Vec::new(),
            next: 0,
        })
    }

    /// Asks once and waits up to `within` for the answer, passing over the answers to earlier
    /// questions that gave up. `Ok(Err(why))`: the model answered no, or raised;
    /// `Err(Gone)`: the process has gone.
    fn ask(&mut self, within: Duration) -> Result<Result<(), String>, Asked> {
        self.next += 1;
        let id = self.next;
        let question = format!("{{\"id\":{id}}}\n");
        self.writer
            .write_all(question.as_bytes())
            .map_err(|e| Asked::Gone(format!("cannot ask its process ({e})")))?;
        let until = Instant::now() + within;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Asked::Late);
            }
            let _ = self.reader.get_ref().set_read_timeout(Some(left));
            match self.reader.read_until(b'\n', &mut self.pending) {
                Ok(0) => return Err(Asked::Gone("its process has gone".into())),
                Ok(_) if !self.pending.ends_with(b"\n") => {
                    return Err(Asked::Gone("its process has gone".into()))
                }
                Ok(_) => {
                    let line = std::mem::take(&mut self.pending);
                    let answer: Value = serde_json::from_slice(&line).map_err(|e| {
                        Asked::Gone(format!("its process answered something else ({e})"))
                    })?;
                    if answer.get("id").and_then(Value::as_u64) != Some(id) {
                        continue;
                    }
                    return Ok(read_answer(&answer));
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    if self.pending.len() > MAX_LINE {
                        return Err(Asked::Gone("its process answered too long a line".into()));
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(Asked::Gone(format!("cannot read its answer ({e})"))),
            }
        }
    }
}

/// What the model's answer says.
fn read_answer(answer: &Value) -> Result<(), String> {
    if let Some(error) = answer.get("error") {
        return Err(format!(
            "its is_ready() failed: {}",
            error.as_str().unwrap_or("without a message")
        ));
    }
    match answer.get("ready").and_then(Value::as_bool) {
        Some(true) => Ok(()),
        _ => Err("its is_ready() returned False".into()),
    }
}

/// Why a question got no answer.
enum Asked {
    /// Not within the time allowed; the line stays.
    Late,
    /// The process has gone, or broke the protocol.
    Gone(String),
}

impl std::fmt::Debug for ReadyWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        f.debug_struct("ReadyWatch")
            .field("down", &state.down)
            .field("asks", &state.line.is_some())
            .finish()
    }
}

impl ReadyWatch {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A process is up and has loaded the model; `line` reaches its `is_ready()`, where it has
    /// one.
    pub(crate) fn up(&self, line: Option<Line>) {
        let mut state = self.lock();
        state.process += 1;
        state.down = None;
        state.line = line;
        self.answered.notify_all();
    }

    /// The instance has no process that can serve, and `why`.
    pub(crate) fn down(&self, why: String) {
        let mut state = self.lock();
        state.process += 1;
        state.down = Some(why);
        state.line = None;
        self.answered.notify_all();
    }
}

impl ReadyCheck for ReadyWatch {
    fn check(&self) -> Result<(), String> {
        let asked = Instant::now();
        let until = asked + READY_TIMEOUT;
        let mut state = self.lock();
        while state.asking {
            if let Some(why) = &state.down {
                return Err(why.clone());
            }
            // Another check's question is out: its answer, come after this check began, does
            // for this one too.
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(late());
            }
            state = self
                .answered
                .wait_timeout(state, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            if let Some((at, result)) = &state.last {
                if *at >= asked {
                    return result.clone();
                }
            }
        }
        if let Some(why) = &state.down {
            return Err(why.clone());
        }
        let Some(mut line) = state.line.take() else {
            return Ok(());
        };
        state.asking = true;
        let process = state.process;
        drop(state);
        let asked = line.ask(READY_TIMEOUT);
        let mut state = self.lock();
        state.asking = false;
        let result = match asked {
            Ok(result) => {
                if state.process == process {
                    state.line = Some(line);
                }
                result
            }
            Err(Asked::Late) => {
                if state.process == process {
                    state.line = Some(line);
                }
                Err(late())
            }
            Err(Asked::Gone(why)) => {
                let why = format!("its Python process gave no answer: {why}");
                if state.process == process {
                    state.down = Some(why.clone());
                }
                Err(why)
            }
        };
        state.last = Some((Instant::now(), result.clone()));
        self.answered.notify_all();
        result
    }
}

fn late() -> String {
    format!(
        "its is_ready() gave no answer within {} s",
        READY_TIMEOUT.as_secs()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;
    use std::sync::Arc;

    /// A process's end of the socket, answering each question with `answer(id)` after `delay`.
    fn serve(
        delay: Duration,
        answer: impl Fn(u64) -> String + Send + 'static,
    ) -> (Line, std::thread::JoinHandle<usize>) {
        let path = crate::region::shared_path("ready-test");
        let listener = UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut writer = stream.try_clone().unwrap();
            let mut asked = 0;
            for line in BufReader::new(stream).lines() {
                let Ok(line) = line else { break };
                let question: Value = serde_json::from_str(&line).unwrap();
                asked += 1;
                std::thread::sleep(delay);
                let id = question["id"].as_u64().unwrap();
                if writer.write_all(answer(id).as_bytes()).is_err() {
                    break;
                }
            }
            asked
        });
        let line = Line::connect(&path).unwrap();
        assert!(
            !path.exists(),
            "the socket's name is removed once connected"
        );
        (line, server)
    }

    #[test]
    fn a_model_without_is_ready_is_ready_while_its_process_runs() {
        let watch = ReadyWatch::default();
        watch.up(None);
        assert_eq!(watch.check(), Ok(()));
        watch.down("its Python process was lost".into());
        assert_eq!(watch.check(), Err("its Python process was lost".into()));
        watch.up(None);
        assert_eq!(watch.check(), Ok(()));
    }

    #[test]
    fn the_models_answers_are_read() {
        let (line, _server) = serve(Duration::ZERO, |id| match id % 3 {
            1 => format!("{{\"id\":{id},\"ready\":true}}\n"),
            2 => format!("{{\"id\":{id},\"ready\":false}}\n"),
            _ => format!("{{\"id\":{id},\"error\":\"ValueError: no database\"}}\n"),
        });
        let watch = ReadyWatch::default();
        watch.up(Some(line));
        assert_eq!(watch.check(), Ok(()));
        assert_eq!(watch.check(), Err("its is_ready() returned False".into()));
        assert_eq!(
            watch.check(),
            Err("its is_ready() failed: ValueError: no database".into())
        );
        assert_eq!(watch.check(), Ok(()));
    }

    #[test]
    fn concurrent_checks_share_one_question() {
        let (line, server) = serve(Duration::from_millis(300), |id| {
            format!("{{\"id\":{id},\"ready\":true}}\n")
        });
        let watch = Arc::new(ReadyWatch::default());
        watch.up(Some(line));
        let checks: Vec<_> = (0..4)
            .map(|_| {
                let watch = watch.clone();
                std::thread::spawn(move || watch.check())
            })
            .collect();
        for check in checks {
            assert_eq!(check.join().unwrap(), Ok(()));
        }
        watch.down("unloaded".into());
        drop(watch);
        // The first check asked; those that found it out took its answer. A check that began
        // after the answer came asks again, so at most two questions went out.
        let asked = server.join().unwrap();
        assert!((1..=2).contains(&asked), "asked {asked} times");
    }

    #[test]
    fn a_late_answer_is_not_ready_and_is_passed_over_later() {
        // Answers the first question after 5.5 s, the later ones at once.
        let (line, _server) = serve(Duration::ZERO, |id| {
            if id == 1 {
                std::thread::sleep(READY_TIMEOUT + Duration::from_millis(500));
                format!("{{\"id\":{id},\"ready\":false}}\n")
            } else {
                format!("{{\"id\":{id},\"ready\":true}}\n")
            }
        });
        let watch = ReadyWatch::default();
        watch.up(Some(line));
        let started = Instant::now();
        assert_eq!(
            watch.check(),
            Err("its is_ready() gave no answer within 5 s".into())
        );
        assert!(started.elapsed() < READY_TIMEOUT + Duration::from_millis(400));
        // The late `false` to question 1 comes first, and is not this question's answer.
        assert_eq!(watch.check(), Ok(()));
    }

    #[test]
    fn a_process_gone_is_not_ready_until_one_is_up_again() {
        let path = crate::region::shared_path("ready-test");
        let listener = UnixListener::bind(&path).unwrap();
        // The process's end closes without an answer.
        let server = std::thread::spawn(move || drop(listener.accept()));
        let line = Line::connect(&path).unwrap();
        server.join().unwrap();
        let watch = ReadyWatch::default();
        watch.up(Some(line));
        let first = watch.check();
        assert!(
            first
                .as_ref()
                .is_err_and(|e| e.starts_with("its Python process gave no answer")),
            "{first:?}"
        );
        assert_eq!(watch.check(), first, "stays down");
        watch.up(None);
        assert_eq!(watch.check(), Ok(()));
    }
}
