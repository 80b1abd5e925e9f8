//! Text and regular expressions written in llama.cpp's grammar notation (GBNF): the exact
//! strings of a choice, and the whole-answer match of a regular expression (vLLM's
//! `guided_choice` and `guided_regex`).
//!
//! A pattern is parsed by `regex-syntax` (Rust's `regex` syntax, which Python's `re` shares
//! for everything a format needs) and written as one GBNF expression. As vLLM's guided decoding
//! reads them, `\d`, `\w` and `\s` are ASCII classes and `.` is any character but a newline;
//! `(?u:…)` asks for Unicode classes. The answer matches the whole pattern, so a leading `^`
//! and a trailing `$` change nothing; other anchors and word boundaries are refused, as are
//! classes of raw bytes, which match no whole character.

use std::fmt::Write;

use regex_syntax::hir::{Class, Hir, HirKind, Look};

/// The most a pattern may repeat an item (`{n}`): llama.cpp writes each repetition out.
const MOST_REPEATS: u32 = 1_000;

/// The most bytes of a pattern, and nesting of its groups.
pub(crate) const MOST_PATTERN_BYTES: usize = 16 * 1024;
const MOST_NESTING: u32 = 64;

/// One character, escaped where GBNF would read it otherwise (inside quotes or a class alike).
fn char_of(c: char, out: &mut String) {
    if c.is_ascii_alphanumeric() || c == ' ' {
        out.push(c);
    } else if (c as u32) < 0x100 {
        let _ = write!(out, "\\x{:02X}", c as u32);
    } else if (c as u32) < 0x10000 {
        let _ = write!(out, "\\u{:04X}", c as u32);
    } else {
        let _ = write!(out, "\\U{:08X}", c as u32);
    }
}

/// The most bytes of a client's grammar, and nesting of its groups: llama.cpp's parser
/// descends once per group.
pub(crate) const MOST_GRAMMAR_BYTES: usize = 64 * 1024;

/// Refuses a client's grammar that is too long or nests its groups too deep to parse safely;
/// what it says is llama.cpp's to check.
pub(crate) fn check_grammar(rules: &str) -> Result<(), String> {
    if rules.len() > MOST_GRAMMAR_BYTES {
        return Err(format!(
            "it is {} bytes; at most {MOST_GRAMMAR_BYTES}",
            rules.len()
        ));
    }
    let (mut depth, mut deepest) = (0u32, 0u32);
    // Outside quotes and classes, a `(` opens a group and `#` a comment to the line's end.
    let mut within: Option<char> = None;
    let mut chars = rules.chars();
    while let Some(c) = chars.next() {
        match (within, c) {
            (Some(_), '\\') => {
                chars.next();
            }
            (Some('#'), '\n') => within = None,
            (Some('"'), '"') | (Some('['), ']') => within = None,
            (Some(_), _) => {}
            (None, '"' | '[' | '#') => within = Some(c),
            (None, '(') => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            (None, ')') => depth = depth.saturating_sub(1),
            (None, _) => {}
        }
    }
    if deepest > MOST_NESTING {
        return Err(format!(
            "its groups nest {deepest} deep; at most {MOST_NESTING}"
        ));
    }
    Ok(())
}

/// `text`, exactly, as a quoted GBNF literal.
pub(crate) fn literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        char_of(c, &mut out);
    }
    out.push('"');
    out
}

/// A GBNF rule `root` whose text matches `pattern` as a whole, or why the pattern cannot be
/// one.
pub(crate) fn regex_rules(pattern: &str) -> Result<String, String> {
    if pattern.len() > MOST_PATTERN_BYTES {
        return Err(format!(
            "the pattern is {} bytes; at most {MOST_PATTERN_BYTES}",
            pattern.len()
        ));
    }
    let hir = regex_syntax::ParserBuilder::new()
        .unicode(false)
        .utf8(false)
        .nest_limit(MOST_NESTING)
        .build()
        .parse(pattern)
        .map_err(|e| format!("not a regular expression: {}", one_line(&e.to_string())))?;
    let mut out = String::from("root ::= ");
    expression(unanchored(&hir).as_ref().unwrap_or(&hir), &mut out)?;
    out.push('\n');
    Ok(out)
}

/// A parser's message, which draws the pattern over several lines, on one.
fn one_line(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.chars().all(|c| c == '^' || c == '~'))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `hir` without a leading start anchor and a trailing end anchor; `None` where it has
/// neither.
fn unanchored(hir: &Hir) -> Option<Hir> {
    let HirKind::Concat(items) = hir.kind() else {
        return matches!(hir.kind(), HirKind::Look(Look::Start | Look::End)).then(Hir::empty);
    };
    let mut items: &[Hir] = items;
    let anchor = |h: &Hir, look: Look| matches!(h.kind(), HirKind::Look(l) if *l == look);
    if let Some((first, rest)) = items.split_first() {
        if anchor(first, Look::Start) {
            items = rest;
        }
    }
    if let Some((last, rest)) = items.split_last() {
        if anchor(last, Look::End) {
            items = rest;
        }
    }
    Some(Hir::concat(items.to_vec()))
}

/// Writes `hir` as one GBNF expression.
fn expression(hir: &Hir, out: &mut String) -> Result<(), String> {
    match hir.kind() {
        HirKind::Empty => out.push_str("\"\""),
        HirKind::Literal(l) => {
            let text = std::str::from_utf8(&l.0)
                .map_err(|_| "it matches bytes that are not UTF-8 text".to_string())?;
            out.push_str(&literal(text));
        }
        HirKind::Class(class) => self::class(class, out)?,
        HirKind::Look(look) => {
            return Err(format!(
                "{look:?}: only a leading ^ and a trailing $ are supported; the answer matches \
                 the whole pattern"
            ))
        }
        HirKind::Repetition(r) => {
            if r.min > MOST_REPEATS || r.max.is_some_and(|m| m > MOST_REPEATS) {
                return Err(format!("a repetition of more than {MOST_REPEATS}"));
            }
            out.push('(');
            expression(&r.sub, out)?;
            out.push(')');
            match (r.min, r.max) {
                (0, None) => out.push('*'),
                (1, None) => out.push('+'),
                (0, Some(1)) => out.push('?'),
                (m, None) => {
                    let _ = write!(out, "{{{m},}}");
                }
                (m, Some(n)) if m == n => {
                    let _ = write!(out, "{{{m}}}");
                }
                (m, Some(n)) => {
                    let _ = write!(out, "{{{m},{n}}}");
                }
            }
        }
        HirKind::Capture(c) => {
            out.push('(');
            expression(&c.sub, out)?;
            out.push(')');
        }
        HirKind::Concat(items) | HirKind::Alternation(items) => {
            let between = if matches!(hir.kind(), HirKind::Concat(_)) {
                " "
            } else {
                " | "
            };
            out.push('(');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(between);
                }
                expression(item, out)?;
            }
            out.push(')');
        }
    }
    Ok(())
}

/// Writes a class as a GBNF character class. Without Unicode, a class of bytes holds ASCII
/// and, where it takes every byte above 0x7F (`.` and negated classes), every character past
/// ASCII.
fn class(class: &Class, out: &mut String) -> Result<(), String> {
    let mut ranges: Vec<(char, char)> = Vec::new();
    match class {
        Class::Unicode(c) => ranges.extend(c.ranges().iter().map(|r| (r.start(), r.end()))),
        Class::Bytes(c) => {
            let mut high = 0u32;
            for r in c.ranges() {
                let (a, b) = (r.start(), r.end());
                if a <= 0x7F {
                    ranges.push((char::from(a), char::from(b.min(0x7F))));
                }
                if b >= 0x80 {
                    high += u32::from(b) - u32::from(a.max(0x80)) + 1;
                }
            }
            match high {
                0 => {}
                0x80 => ranges.push(('\u{80}', char::MAX)),
                _ => {
                    return Err("a class of bytes above 0x7F matches no whole character; \
                                write the characters, or (?u:…) for a Unicode class"
                        .into())
                }
            }
        }
    }
    if ranges.is_empty() {
        return Err("a class that matches no character".into());
    }
    out.push('[');
    for (a, b) in ranges {
        char_of(a, out);
        if b != a {
            out.push('-');
            char_of(b, out);
        }
    }
    out.push(']');
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_escape_what_gbnf_would_read() {
        assert_eq!(literal("ab 1"), r#""ab 1""#);
        assert_eq!(literal("a\"b\\\n"), r#""a\x22b\x5C\x0A""#);
        assert_eq!(literal("é😀"), r#""\xE9\U0001F600""#);
    }

    #[test]
    fn grammars_too_long_or_too_deep_are_refused() {
        assert_eq!(check_grammar(r#"root ::= ("a" | "(" [(] ) # (((("#), Ok(()));
        let deep = format!("root ::= {}\"a\"{}", "(".repeat(65), ")".repeat(65));
        assert!(check_grammar(&deep).unwrap_err().contains("65 deep"));
        let quoted = format!("root ::= \"{}\"", "(".repeat(100));
        assert_eq!(check_grammar(&quoted), Ok(()));
        let long = format!("root ::= \"{}\"", "a".repeat(MOST_GRAMMAR_BYTES));
        assert!(check_grammar(&long).unwrap_err().contains("at most"));
    }

    #[test]
    fn patterns_become_one_rule() {
        let root = |p: &str| regex_rules(p).unwrap();
        assert_eq!(
            root(r"^\d{3}-\d{4}$"),
            "root ::= (([0-9]){3} \"\\x2D\" ([0-9]){4})\n"
        );
        assert_eq!(root("yes|no"), "root ::= (\"yes\" | \"no\")\n");
        assert_eq!(root("a+b*c?"), "root ::= ((\"a\")+ (\"b\")* (\"c\")?)\n");
        assert_eq!(root("x{2,}y{1,3}"), "root ::= ((\"x\"){2,} (\"y\"){1,3})\n");
        assert_eq!(root(r"\w"), "root ::= [0-9A-Z\\x5Fa-z]\n");
        // `.` and a negated class: every character but the ones left out.
        assert_eq!(
            root("."),
            "root ::= [\\x00-\\x09\\x0B-\\x7F\\x80-\\U0010FFFF]\n"
        );
        assert_eq!(
            root("[^a]"),
            "root ::= [\\x00-\\x60b-\\x7F\\x80-\\U0010FFFF]\n"
        );
        assert_eq!(root("(?u:[α-ω])"), "root ::= [\\u03B1-\\u03C9]\n");
        assert_eq!(root("é"), "root ::= \"\\xE9\"\n");
        assert_eq!(root("^$"), "root ::= \"\"\n");
    }

    #[test]
    fn what_no_grammar_can_hold_is_refused_by_why() {
        let why = |p: &str| regex_rules(p).unwrap_err();
        assert!(
            why("a(b").starts_with("not a regular expression"),
            "{}",
            why("a(b")
        );
        assert!(
            why(r"\bword").contains("only a leading ^"),
            "{}",
            why(r"\bword")
        );
        assert!(why("a^b").contains("only a leading ^"));
        assert!(why(r"(?-u:\xFF)").contains("UTF-8") || why(r"(?-u:\xFF)").contains("byte"));
        assert!(why("a{1001}").contains("more than 1000"));
        assert!(why(&"(".repeat(100)).starts_with("not a regular expression"));
        assert!(why(&"a".repeat(MOST_PATTERN_BYTES + 1)).contains("at most"));
    }
}
