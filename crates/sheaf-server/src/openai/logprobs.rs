//! OpenAI's two shapes of `logprobs`: chat's `{"content": [{token, logprob, bytes,
//! top_logprobs}]}`, and the completions route's `{tokens, token_logprobs, top_logprobs,
//! text_offset}`. The engine reports each token once ([`TokenLogprob`]); these only render it.

use serde_json::{json, Map, Value};
use sheaf_backend::generation::{TokenLogprob, TokenProb};

/// What OpenAI writes for a probability of zero (JSON has no infinity).
const FLOOR: f32 = -9999.0;

fn logprob(p: &TokenProb) -> f32 {
    p.logprob.max(FLOOR)
}

fn text(p: &TokenProb) -> String {
    String::from_utf8_lossy(&p.bytes).into_owned()
}

fn entry(p: &TokenProb) -> Value {
    json!({ "token": text(p), "logprob": logprob(p), "bytes": p.bytes })
}

/// Chat's shape.
pub fn chat(tokens: &[TokenLogprob]) -> Value {
    let content: Vec<Value> = tokens
        .iter()
        .map(|t| {
            let mut e = entry(&t.chosen);
            e["top_logprobs"] = t.top.iter().map(entry).collect();
            e
        })
        .collect();
    json!({ "content": content })
}

/// The completions route's shape; `offset` is where the first token's text starts in the
/// answer, and moves past these tokens.
pub fn completion(tokens: &[TokenLogprob], offset: &mut usize) -> Value {
    let mut text_offset = Vec::with_capacity(tokens.len());
    for t in tokens {
        text_offset.push(*offset);
        *offset += text(&t.chosen).len();
    }
    let top: Vec<Value> = tokens
        .iter()
        .map(|t| {
            let alternatives: Map<String, Value> =
                t.top.iter().map(|p| (text(p), json!(logprob(p)))).collect();
            Value::Object(alternatives)
        })
        .collect();
    json!({
        "tokens": tokens.iter().map(|t| text(&t.chosen)).collect::<Vec<_>>(),
        "token_logprobs": tokens.iter().map(|t| logprob(&t.chosen)).collect::<Vec<_>>(),
        "top_logprobs": top,
        "text_offset": text_offset,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(bytes: &[u8], logprob: f32) -> TokenProb {
        TokenProb {
            token: 0,
            bytes: bytes.to_vec(),
            logprob,
        }
    }

    #[test]
    fn both_shapes_render_the_same_tokens() {
        let tokens = vec![
            TokenLogprob {
                chosen: token(b"Par", -0.1),
                top: vec![token(b"Par", -0.1), token(b"The", -2.5)],
            },
            TokenLogprob {
                chosen: token(b"is", f32::NEG_INFINITY),
                top: vec![],
            },
        ];
        let c = chat(&tokens);
        assert_eq!(c["content"][0]["token"], "Par");
        assert_eq!(c["content"][0]["bytes"], json!([80, 97, 114]));
        assert_eq!(c["content"][0]["top_logprobs"][1]["token"], "The");
        assert_eq!(c["content"][1]["logprob"], json!(FLOOR));
        let mut offset = 3;
        let t = completion(&tokens, &mut offset);
        assert_eq!(t["tokens"], json!(["Par", "is"]));
        assert_eq!(t["text_offset"], json!([3, 6]));
        assert_eq!(offset, 8);
        assert!((t["top_logprobs"][0]["The"].as_f64().unwrap() + 2.5).abs() < 1e-6);
    }
}
