//! Turning a sequence's token pieces into text: whole UTF-8 characters only, with stop strings
//! found across piece boundaries and never sent.

/// The text generated so far, and how much of it has been sent.
#[derive(Debug, Default)]
pub struct TextState {
    /// Bytes of a character split between pieces.
    pending: Vec<u8>,
    text: String,
    sent: usize,
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

    /// Where the earliest stop string starts, if one has appeared.
    pub fn stop_at(&self, stops: &[String]) -> Option<usize> {
        stops
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| self.text.find(s.as_str()))
            .min()
    }

    /// Ends the text at `at` (a stop string's start).
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
            if let Some(at) = t.stop_at(&stops) {
                t.truncate(at);
                sent.extend(t.take(0));
                break;
            }
            sent.extend(t.take(stops[0].len() - 1));
        }
        assert_eq!(sent, "Paris.");
    }
}
