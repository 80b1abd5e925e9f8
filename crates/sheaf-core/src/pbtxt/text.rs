//! Protobuf text format read without a schema: a tree of named fields ([`parse`]), and the
//! readers of one field's value (a word, a count, a message, a map entry, dims).

/// A value in text format.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A number, an enum name or `true`/`false`, as written.
    Word(String),
    Text(String),
    Message(Vec<(String, Value)>),
    List(Vec<Value>),
}

impl Value {
    /// The values of a field written once, several times, or as a list.
    pub(crate) fn items(&self) -> Vec<&Value> {
        match self {
            Value::List(items) => items.iter().collect(),
            one => vec![one],
        }
    }
}

/// Reads a text-format message: `name: value`, `name { ... }`, `name: [a, b]`, `#` comments.
pub fn parse(text: &str) -> Result<Vec<(String, Value)>, String> {
    let mut p = Parser {
        chars: text.chars().collect(),
        at: 0,
        line: 1,
        depth: 0,
    };
    let fields = p.fields(None)?;
    Ok(fields)
}

/// How deep messages and lists may nest, as protobuf's own text-format reader allows: Triton's
/// deepest configurations nest about six, and every level is a frame of the reader's stack.
const MAX_DEPTH: usize = 100;

struct Parser {
    chars: Vec<char>,
    at: usize,
    line: usize,
    /// Messages and lists open around the value being read.
    depth: usize,
}

impl Parser {
    fn error<T>(&self, what: &str) -> Result<T, String> {
        Err(format!("line {}: {what}", self.line))
    }

    fn peek(&mut self) -> Option<char> {
        loop {
            let c = *self.chars.get(self.at)?;
            match c {
                '#' => {
                    while self.chars.get(self.at).is_some_and(|&c| c != '\n') {
                        self.at += 1;
                    }
                }
                '\n' => {
                    self.line += 1;
                    self.at += 1;
                }
                c if c.is_whitespace() => self.at += 1,
                c => return Some(c),
            }
        }
    }

    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    /// Fields up to `close` (`}` or `>`), or to the end of the text.
    fn fields(&mut self, close: Option<char>) -> Result<Vec<(String, Value)>, String> {
        let mut fields = Vec::new();
        loop {
            match (self.peek(), close) {
                (None, None) => return Ok(fields),
                (None, Some(c)) => return self.error(&format!("missing '{c}'")),
                (Some(c), Some(close)) if c == close => {
                    self.at += 1;
                    return Ok(fields);
                }
                _ => {}
            }
            let name = self.word()?;
            if name.is_empty() {
                return self.error("expected a field name");
            }
            let colon = self.eat(':');
            let value = match self.peek() {
                Some('{' | '<' | '[') => self.value()?,
                _ if colon => self.value()?,
                _ => return self.error(&format!("expected ':' or '{{' after '{name}'")),
            };
            fields.push((name, value));
            // Fields may be separated by ',' or ';'.
            let _ = self.eat(',') || self.eat(';');
        }
    }

    fn value(&mut self) -> Result<Value, String> {
        if !matches!(self.peek(), Some('{' | '<' | '[')) {
            return self.scalar();
        }
        if self.depth == MAX_DEPTH {
            return self.error(&format!(
                "messages and lists nest more than {MAX_DEPTH} deep"
            ));
        }
        self.depth += 1;
        let value = self.nested();
        self.depth -= 1;
        value
    }

    /// A message (`{ ... }` or `< ... >`) or a list (`[ ... ]`).
    fn nested(&mut self) -> Result<Value, String> {
        match self.peek() {
            Some('{') => {
                self.at += 1;
                Ok(Value::Message(self.fields(Some('}'))?))
            }
            Some('<') => {
                self.at += 1;
                Ok(Value::Message(self.fields(Some('>'))?))
            }
            Some('[') => {
                self.at += 1;
                let mut items = Vec::new();
                if self.eat(']') {
                    return Ok(Value::List(items));
                }
                loop {
                    items.push(self.value()?);
                    if self.eat(']') {
                        return Ok(Value::List(items));
                    }
                    if !self.eat(',') {
                        return self.error("expected ',' or ']' in a list");
                    }
                }
            }
            _ => self.scalar(),
        }
    }

    /// A string (adjacent strings join, as in protobuf), or a word: a number, an enum value.
    fn scalar(&mut self) -> Result<Value, String> {
        match self.peek() {
            Some('"' | '\'') => {
                let mut text = String::new();
                while let Some(q @ ('"' | '\'')) = self.peek() {
                    self.string(q, &mut text)?;
                }
                Ok(Value::Text(text))
            }
            Some(_) => {
                let word = self.word()?;
                if word.is_empty() {
                    return self.error("expected a value");
                }
                Ok(Value::Word(word))
            }
            None => self.error("expected a value"),
        }
    }

    /// A string quoted with `q` (the reader at its opening quote), appended to `text`.
    fn string(&mut self, q: char, text: &mut String) -> Result<(), String> {
        self.at += 1;
        loop {
            match self.chars.get(self.at).copied() {
                None | Some('\n') => return self.error("unterminated string"),
                Some(c) if c == q => {
                    self.at += 1;
                    return Ok(());
                }
                Some('\\') => {
                    let escaped = self.chars.get(self.at + 1).copied();
                    text.push(match escaped {
                        Some('n') => '\n',
                        Some('t') => '\t',
                        Some(c) => c,
                        None => return self.error("unterminated string"),
                    });
                    self.at += 2;
                }
                Some(c) => {
                    text.push(c);
                    self.at += 1;
                }
            }
        }
    }

    /// A name, a number or an enum word (letters, digits, `_`, `.`, `-`, `+`, and `[...]` for
    /// extension names).
    fn word(&mut self) -> Result<String, String> {
        let _ = self.peek();
        let mut word = String::new();
        while let Some(&c) = self.chars.get(self.at) {
            if c.is_alphanumeric() || matches!(c, '_' | '.' | '-' | '+' | '/') {
                word.push(c);
                self.at += 1;
            } else if c == '[' && word.is_empty() {
                // `[pkg.extension]`
                while let Some(&c) = self.chars.get(self.at) {
                    word.push(c);
                    self.at += 1;
                    if c == ']' {
                        break;
                    }
                }
            } else {
                break;
            }
        }
        Ok(word)
    }
}

/// One entry of a map field (`{ key: "k" value: ... }`): its key, and its value if written.
pub(crate) fn map_entry<'v>(
    path: &str,
    entry: &'v Value,
) -> Result<(String, Option<&'v Value>), String> {
    let fields = message(path, entry)?;
    let find = |name: &str| fields.iter().find(|(n, _)| n == name).map(|(_, v)| v);
    let key = find("key").ok_or(format!("{path}: an entry without a key"))?;
    Ok((
        word(&format!("{path}.key"), key)?.to_string(),
        find("value"),
    ))
}

pub(crate) fn message<'v>(name: &str, value: &'v Value) -> Result<&'v [(String, Value)], String> {
    match value {
        Value::Message(fields) => Ok(fields),
        _ => Err(format!("{name}: expected a message {{ ... }}")),
    }
}

/// A `true` or a `false`.
pub(super) fn boolean(name: &str, value: &Value) -> Result<bool, String> {
    match word(name, value)? {
        "true" => Ok(true),
        "false" => Ok(false),
        other => Err(format!("{name}: {other} is neither true nor false")),
    }
}

pub(super) fn count(name: &str, value: &Value) -> Result<usize, String> {
    match value {
        Value::Word(w) => w
            .parse::<usize>()
            .map_err(|_| format!("{name}: '{w}' is not a count")),
        other => Err(format!("{name}: {other:?} is not a count")),
    }
}

pub(super) fn counts(name: &str, value: &Value) -> Result<Vec<usize>, String> {
    value.items().into_iter().map(|v| count(name, v)).collect()
}

pub(crate) fn word<'v>(name: &str, value: &'v Value) -> Result<&'v str, String> {
    match value {
        Value::Word(w) => Ok(w),
        Value::Text(t) => Ok(t),
        other => Err(format!("{name}: {other:?} is not a word")),
    }
}

pub(super) fn dims(path: &str, value: &Value) -> Result<Vec<i64>, String> {
    value
        .items()
        .into_iter()
        .map(|d| {
            word(path, d)?
                .parse::<i64>()
                .map_err(|_| format!("{path}: {d:?} is not a dimension"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nesting is bounded, so that a file cannot overflow the reader's stack (which aborted
    /// the server); a hundred levels read, more is an error naming the line. Adjacent strings
    /// join without a frame each.
    #[test]
    fn nesting_is_bounded_and_adjacent_strings_join_in_one_frame() {
        // `x` holding n messages (or lists) one inside the other, the innermost holding 1.
        let nest = |n: usize, open: &str, inner: &str, close: &str| {
            format!("a: 1\nx: {}{inner}{}", open.repeat(n), close.repeat(n))
        };
        for (open, inner, close) in [("{ y: ", "1", "} "), ("< y: ", "1", "> "), ("[", "1", "]")] {
            let error = parse(&nest(200_000, open, inner, close)).unwrap_err();
            assert_eq!(error, "line 2: messages and lists nest more than 100 deep");
            assert!(parse(&nest(101, open, inner, close)).is_err(), "{open}");
            let deepest = nest(100, open, inner, close);
            assert!(parse(&deepest).is_ok(), "{open}: {deepest}");
        }
        assert!(parse(&format!("x: {}", "[".repeat(101))).is_err());
        let many = format!("x: {}", "\"ab\" ".repeat(300_000));
        let fields = parse(&many).unwrap();
        assert!(matches!(&fields[0].1, Value::Text(t) if t.len() == 600_000));
    }
}
