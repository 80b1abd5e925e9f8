//! OpenAI's two shapes of `logprobs`: chat's `{"content": [{token, logprob, bytes,
//! top_logprobs}]}`, and the completions route's `{tokens, token_logprobs, top_logprobs,
//! text_offset}`, which with `echo` starts with the prompt's tokens; and vLLM's
//! `prompt_logprobs`, `[null, {"<id>": {logprob, rank, decoded_token}}, …]`. The engine reports
//! each token once ([`TokenLogprob`], [`PromptLogprobs`]); these only render it.

use serde_json::{json, Map, Value};
use sheaf_backend::generation::{PromptLogprobs, TokenLogprob, TokenProb};

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
    Columns::default()
        .tokens(tokens, usize::MAX, offset)
        .render()
}

/// The completions route's shape for an echoed prompt and the answer after it: the prompt's
/// first token has no log-probability (`null`), and each prompt token has its `top` most
/// likely alternatives.
pub fn echoed(prompt: &PromptLogprobs, top: usize, tokens: &[TokenLogprob]) -> Value {
    let mut offset = 0;
    prompt_columns(prompt, top, &mut offset)
        .tokens(tokens, usize::MAX, &mut offset)
        .render()
}

/// The echoed prompt's part of [`echoed`] alone, as a streamed answer's first chunk carries
/// it; `offset` moves past the prompt, to where the answer's first token starts.
pub fn echoed_prompt(prompt: &PromptLogprobs, top: usize, offset: &mut usize) -> Value {
    prompt_columns(prompt, top, offset).render()
}

/// The columns of a prompt read from `offset` on: its first token without a log-probability.
fn prompt_columns(prompt: &PromptLogprobs, top: usize, offset: &mut usize) -> Columns {
    let mut columns = Columns::default();
    let first = String::from_utf8_lossy(&prompt.first.1).into_owned();
    columns.text_offset.push(*offset);
    *offset += first.len();
    columns.tokens.push(json!(first));
    columns.token_logprobs.push(Value::Null);
    columns.top_logprobs.push(Value::Null);
    columns.tokens(&prompt.rest, top, offset)
}

/// The four lists of the completions route's shape, filled a token at a time.
#[derive(Default)]
struct Columns {
    tokens: Vec<Value>,
    token_logprobs: Vec<Value>,
    top_logprobs: Vec<Value>,
    text_offset: Vec<usize>,
}

impl Columns {
    /// Adds `tokens`, each with at most `top` alternatives, from `offset` on.
    fn tokens(mut self, tokens: &[TokenLogprob], top: usize, offset: &mut usize) -> Columns {
        for t in tokens {
            self.text_offset.push(*offset);
            *offset += text(&t.chosen).len();
            self.tokens.push(json!(text(&t.chosen)));
            self.token_logprobs.push(json!(logprob(&t.chosen)));
            let alternatives: Map<String, Value> = t
                .top
                .iter()
                .take(top)
                .map(|p| (text(p), json!(logprob(p))))
                .collect();
            self.top_logprobs.push(Value::Object(alternatives));
        }
        self
    }

    fn render(self) -> Value {
        json!({
            "tokens": self.tokens,
            "token_logprobs": self.token_logprobs,
            "top_logprobs": self.top_logprobs,
            "text_offset": self.text_offset,
        })
    }
}

/// vLLM's `prompt_logprobs`: `null` for the first token, then for each later one its own entry
/// and its `top` most likely alternatives, keyed by token id.
pub fn prompt(prompt: &PromptLogprobs, top: usize) -> Value {
    std::iter::once(Value::Null)
        .chain(positions(&prompt.rest, top))
        .collect()
}

/// vLLM's shape for each of `tokens`: an object keyed by token id holding the chosen token and
/// its `top` most likely alternatives, each with its log-probability, rank (1 is the most
/// likely) and text.
pub fn positions(tokens: &[TokenLogprob], top: usize) -> impl Iterator<Item = Value> + '_ {
    let entry = |p: &TokenProb, rank: usize| json!({ "logprob": logprob(p), "rank": rank, "decoded_token": text(p) });
    tokens.iter().map(move |t| {
        let mut position = Map::new();
        for (i, p) in t.top.iter().take(top).enumerate() {
            position.insert(p.token.to_string(), entry(p, i + 1));
        }
        position.insert(t.chosen.token.to_string(), entry(&t.chosen, t.rank));
        Value::Object(position)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(bytes: &[u8], logprob: f32) -> TokenProb {
        TokenProb {
            token: bytes.len() as i32 + 100 * bytes.last().map_or(0, |&b| i32::from(b)),
            bytes: bytes.to_vec(),
            logprob,
        }
    }

    #[test]
    fn both_shapes_render_the_same_tokens() {
        let tokens = vec![
            TokenLogprob {
                chosen: token(b"Par", -0.1),
                rank: 1,
                top: vec![token(b"Par", -0.1), token(b"The", -2.5)],
            },
            TokenLogprob {
                chosen: token(b"is", f32::NEG_INFINITY),
                rank: 7,
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

    #[test]
    fn an_echoed_prompt_leads_with_a_null_and_vllm_s_shape_ranks_each_token() {
        let prompt = PromptLogprobs {
            first: (1, b"The".to_vec()),
            rest: vec![TokenLogprob {
                chosen: token(b" sky", -1.5),
                rank: 3,
                top: vec![token(b" cat", -0.5), token(b" dog", -1.0)],
            }],
        };
        let generated = vec![TokenLogprob {
            chosen: token(b" is", -0.25),
            rank: 1,
            top: vec![token(b" is", -0.25)],
        }];
        let e = echoed(&prompt, 1, &generated);
        assert_eq!(e["tokens"], json!(["The", " sky", " is"]));
        assert_eq!(e["token_logprobs"], json!([null, -1.5, -0.25]));
        assert_eq!(e["top_logprobs"][0], Value::Null);
        assert_eq!(
            e["top_logprobs"][1],
            json!({" cat": -0.5}),
            "one alternative asked for"
        );
        assert_eq!(e["text_offset"], json!([0, 3, 7]));
        // Streamed: the prompt's chunk, then the answer's from where the prompt ends.
        let mut offset = 0;
        let head = echoed_prompt(&prompt, 1, &mut offset);
        let tail = completion(&generated, &mut offset);
        for column in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
            let mut joined = head[column].as_array().unwrap().clone();
            joined.extend(tail[column].as_array().unwrap().iter().cloned());
            assert_eq!(Value::Array(joined), e[column], "{column}");
        }
        let v = super::prompt(&prompt, 1);
        let id = |t: &TokenProb| t.token.to_string();
        assert_eq!(v[0], Value::Null);
        assert_eq!(
            v[1][id(&prompt.rest[0].chosen)],
            json!({"logprob": -1.5, "rank": 3, "decoded_token": " sky"})
        );
        assert_eq!(
            v[1][id(&prompt.rest[0].top[0])],
            json!({"logprob": -0.5, "rank": 1, "decoded_token": " cat"})
        );
        assert_eq!(
            v[1].as_object().unwrap().len(),
            2,
            "the token and one alternative"
        );
    }
}
