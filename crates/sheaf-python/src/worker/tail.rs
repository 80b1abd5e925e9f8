//! The last lines a model process wrote to stderr, kept so that a process that ends says why:
//! a model that fails before the runner can answer (an interpreter without NumPy, a crash in
//! native code) has only its traceback or its last words there.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// Lines kept.
const LINES: usize = 8;
/// Characters kept of each line.
const WIDTH: usize = 500;

/// See the module documentation.
#[derive(Default)]
pub(crate) struct Tail {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    lines: VecDeque<String>,
    /// The stream has ended (the process closed its stderr).
    ended: bool,
}

impl Tail {
    /// Keeps `line`, dropping the oldest beyond [`LINES`].
    pub(crate) fn push(&self, line: &str) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.lines.len() == LINES {
            state.lines.pop_front();
        }
        state.lines.push_back(match line.char_indices().nth(WIDTH) {
            Some((end, _)) => format!("{}…", &line[..end]),
            None => line.to_string(),
        });
    }

    /// The stream has ended.
    pub(crate) fn end(&self) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).ended = true;
        self.changed.notify_all();
    }

    /// The kept lines, one per line, once the stream has ended or `grace` has passed; none when
    /// nothing was written.
    pub(crate) fn last_words(&self, grace: Duration) -> Option<String> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (state, _) = self
            .changed
            .wait_timeout_while(state, grace, |s| !s.ended)
            .unwrap_or_else(|e| e.into_inner());
        (!state.lines.is_empty()).then(|| Vec::from(state.lines.clone()).join("\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn keeps_the_last_lines_cut_to_width_and_waits_for_the_end() {
        let tail = Arc::new(Tail::default());
        assert_eq!(tail.last_words(Duration::ZERO), None);
        for k in 0..12 {
            tail.push(&format!("line {k}"));
        }
        tail.push(&"x".repeat(WIDTH + 10));
        let words = tail.last_words(Duration::ZERO).unwrap();
        let lines: Vec<&str> = words.lines().collect();
        assert_eq!(lines.len(), LINES);
        assert_eq!(lines[0], "line 5");
        assert_eq!(lines[LINES - 1].chars().count(), WIDTH + 1);
        // A line that comes just before the end is waited for.
        let writer = tail.clone();
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            writer.push("ModuleNotFoundError: No module named 'numpy'");
            writer.end();
        });
        let words = tail.last_words(Duration::from_secs(10)).unwrap();
        assert!(
            words.ends_with("ModuleNotFoundError: No module named 'numpy'"),
            "{words}"
        );
        late.join().unwrap();
    }
}
