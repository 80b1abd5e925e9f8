//! Reading the YAML files (a model's `config.yaml`, a `pipeline.yaml`, `sheaf.yaml`, a simulated
//! model's `model.sim.yaml`): serde_yaml,
//! after a linear check that flow collections (`[...]`, `{...}`) nest at most [`MAX_DEPTH`]
//! deep. libyaml's scanner, under serde_yaml, takes time quadratic in that depth (a file of
//! 40,000 nested brackets took seconds to refuse, 200,000 minutes), and no configuration nests
//! more than a few levels; the bound is the one `config.pbtxt` has.

use serde::de::DeserializeOwned;

/// How deep flow collections may nest.
pub const MAX_DEPTH: usize = 100;

/// `text` as a `T`, its flow nesting checked first.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, String> {
    if flow_depth(text) > MAX_DEPTH {
        return Err(format!(
            "brackets ('[' and '{{') nest more than {MAX_DEPTH} deep"
        ));
    }
    serde_yaml::from_str(text).map_err(|e| e.to_string())
}

/// The most `[`/`{` open at once, outside quoted scalars and comments. A quote opens a scalar
/// only where a scalar can start (after a space, a line's start or an indicator), as in YAML;
/// a bracket inside a plain scalar counts, which can only overstate the depth.
fn flow_depth(text: &str) -> usize {
    enum In {
        Plain,
        Single,
        Double,
        Comment,
    }
    let (mut state, mut depth, mut most) = (In::Plain, 0usize, 0usize);
    let mut before = b'\n';
    let mut bytes = text.bytes().peekable();
    while let Some(b) = bytes.next() {
        match state {
            In::Plain => match b {
                b'#' if before.is_ascii_whitespace() => state = In::Comment,
                b'\'' | b'"' if b" \t\r\n[{,:-?".contains(&before) => {
                    state = if b == b'"' { In::Double } else { In::Single };
                }
                b'[' | b'{' => {
                    depth += 1;
                    most = most.max(depth);
                }
                b']' | b'}' => depth = depth.saturating_sub(1),
                _ => {}
            },
            In::Double => match b {
                b'\\' => {
                    bytes.next();
                }
                b'"' => state = In::Plain,
                _ => {}
            },
            In::Single if b == b'\'' => {
                if bytes.peek() == Some(&b'\'') {
                    bytes.next();
                } else {
                    state = In::Plain;
                }
            }
            In::Comment if b == b'\n' => state = In::Plain,
            In::Single | In::Comment => {}
        }
        before = b;
    }
    most
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deep flow nesting is refused at once, however it hides among quotes and comments; the
    /// configurations people write, brackets in quoted and plain text included, read as before.
    #[test]
    fn flow_nesting_is_bounded_before_the_parser_runs() {
        let deep = |n: usize| format!("a: {}1{}\n", "[".repeat(n), "]".repeat(n));
        assert!(from_str::<serde_yaml::Value>(&deep(100)).is_ok());
        let error = from_str::<serde_yaml::Value>(&deep(200_000)).unwrap_err();
        assert!(error.contains("nest more than 100 deep"), "{error}");
        // A quote in a plain word opens nothing; brackets in quoted strings do not close.
        let hidden = format!(
            "a: it's\nb: {}\n",
            "[ \"]\" , ".repeat(150) + "1" + &"]".repeat(150)
        );
        assert!(flow_depth(&hidden) > MAX_DEPTH);
        let fine = "name: \"[x\" # a [comment\nlist: [a, 'b]]', {c: d}]\nq: it's [here\n";
        assert_eq!(flow_depth(fine), 2);
        assert!(from_str::<serde_yaml::Value>(fine).is_ok());
    }
}
