//! Turning a sequence's token pieces into text: whole UTF-8 characters only, with stop strings
//! found across piece boundaries and never sent unless asked for.

/// The text generated so far, and how much of it has been sent.
#[derive(Debug, Default)]
pub struct TextState {
    /// Bytes of a character split between pieces.
    pending: Vec<u8>,
    text: String,
    sent: usize,
    /// Where stop strings are looked for from.
    from: usize,
}

impl TextState {
    /// Adds one token's bytes.
    pub fn push(&mut self, piece: &[u8]) {
        self.pending.extend_from_slice(piece);
        match std::str::from_utf8(&self.pending) {
            Ok(s) => {
                self.text.push_str(s);
                self.pending.clear();
            }
            Err(e) => {
                let valid = e.valid_up_to();
                // An invalid sequence (not just an unfinished one) is replaced and dropped.
                let (good, rest) = self.pending.split_at(valid);
                self.text
                    .push_str(std::str::from_utf8(good).unwrap_or_default());
                let rest = rest.to_vec();
                if e.error_len().is_some() {
                    self.text.push(char::REPLACEMENT_CHARACTER);
                    self.pending.clear();
                } else {
                    self.pending = rest;
                }
            }
        }
    }

    /// Where the earliest stop string starts, its length and its place in `stops`, if one has
    /// appeared since [`TextState::pass_stops`] was last called.
    pub fn stop_at(&self, stops: &[String]) -> Option<(usize, usize, usize)> {
        let text = &self.text[self.from..];
        stops
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.is_empty())
            .filter_map(|(i, s)| text.find(s.as_str()).map(|at| (self.from + at, s.len(), i)))
            .min()
    }

    /// Looks for stop strings only in text pushed after this.
    pub fn pass_stops(&mut self) {
        self.from = self.text.len();
    }

    /// Ends the text at `at` (where a stop string starts, or ends when it is returned).
    pub fn truncate(&mut self, at: usize) {
        self.text.truncate(at);
        self.sent = self.sent.min(at);
        self.pending.clear();
    }

    /// Text not sent yet, keeping back the last `hold` bytes (a stop string may be forming).
    pub fn take(&mut self, hold: usize) -> Option<String> {
        let mut end = self.text.len().saturating_sub(hold);
        while !self.text.is_char_boundary(end) {
            end -= 1;
        }
        (end > self.sent).then(|| {
            let out = self.text[self.sent..end].to_string();
            self.sent = end;
            out
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn characters_split_across_pieces_come_out_whole() {
        let mut t = TextState::default();
        let bytes = "é!".as_bytes();
        t.push(&bytes[..1]);
        assert_eq!(t.take(0), None);
        t.push(&bytes[1..]);
        assert_eq!(t.take(0).as_deref(), Some("é!"));
    }

    #[test]
    fn stop_strings_across_pieces_are_found_and_never_sent() {
        let stops = vec!["\nUser".to_string()];
        let mut t = TextState::default();
        let mut sent = String::new();
        for piece in ["Paris.", "\nUs", "er: hi"] {
            t.push(piece.as_bytes());
            if let Some((at, ..)) = t.stop_at(&stops) {
                t.truncate(at);
                sent.extend(t.take(0));
                break;
            }
            sent.extend(t.take(stops[0].len() - 1));
        }
        assert_eq!(sent, "Paris.");
    }

    #[test]
    fn stop_strings_are_looked_for_after_the_text_passed() {
        let stops = vec!["a".to_string(), "bc".to_string()];
        let mut t = TextState::default();
        t.push(b"xa");
        t.pass_stops();
        assert_eq!(
            t.stop_at(&stops),
            None,
            "an `a` before the pass does not stop it"
        );
        t.push(b"ybca");
        assert_eq!(
            t.stop_at(&stops),
            Some((3, 2, 1)),
            "the earliest after the pass, its length and which it is"
        );
        t.truncate(3 + 2);
        assert_eq!(t.take(0).as_deref(), Some("xaybc"));
    }
}
