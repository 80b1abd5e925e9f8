//! The contract of Triton's vLLM backend, served by a generation model, so that clients
//! written for `tritonserver` with that backend run unchanged: over HTTP through the generate
//! extension (`crate::http`'s generate routes), over gRPC as a KServe request with its tensors
//! (`crate::grpc`).
//!
//! A request holds `text_input` (the prompt, as text); the backend's switches `stream`,
//! `exclude_input_in_output` and `return_finish_reason`, `return_num_input_tokens`,
//! `return_num_output_tokens`, `return_cumulative_logprob`, `return_logprobs`; and vLLM's
//! sampling parameters (`max_tokens`, `temperature`, `top_p`, `top_k`, `min_p`, `seed`, `stop`,
//! penalties, `logprobs`, `n`, …), each as a field (an input, over gRPC) of its own, in the
//! request's parameters, or in `sampling_parameters` (a JSON object written as a string, the
//! backend's input of that name). A name given twice, in any of those places, or one the
//! contract does not hold, is refused naming it. The sampling parameters are read as
//! `/v1/completions` reads its fields, with the same defaults (16 tokens) and limits, and the
//! request takes the same path: the model's queue, then the engine.
//!
//! An answer holds an element per output (`n`, 1 unless asked; output `i` samples with
//! `seed + i`). Without `stream`, the answer is one [`TextAnswer`]: each output's text after the
//! prompt, or the text alone with `exclude_input_in_output: true`. With `stream: true` each
//! piece of text is an answer of its own, as it comes, without the prompt (asking for it is
//! refused, as under Triton), its text in its output's element and the others empty; an
//! output's end is an answer with empty texts, and the last output's ends the stream. Each
//! answer carries, per output, what was asked for besides: the finish reason (`stop` or
//! `length`; none until the output has ended), the output's tokens (streamed: that answer's
//! own), its tokens' log-probabilities summed, and each of its tokens with its log-probability
//! and its `logprobs` most likely alternatives (vLLM's shape, as JSON text; `null` where the
//! sampling parameter `logprobs` was not given, as the backend answers); and the prompt's
//! tokens. Each protocol renders the answers.

use futures::stream::BoxStream;
use futures::StreamExt;
use serde_json::{json, Map, Value};
use sheaf_backend::generation::{Event, FinishReason, Prompt, TokenLogprob, Usage};
use sheaf_backend::DataType;
use sheaf_core::{Generate, InferError, ModelHandle, RawRequest};

use crate::http::Once;
use crate::openai::handlers::{merged, timed, Timing};
use crate::openai::logprobs::positions;
use crate::openai::wire::CompletionRequest;
use crate::AppState;

/// The backend's switches (module docs), each false unless given.
const SWITCHES: [&str; 7] = [
    "stream",
    "exclude_input_in_output",
    "return_finish_reason",
    "return_num_input_tokens",
    "return_num_output_tokens",
    "return_cumulative_logprob",
    "return_logprobs",
];

/// The sampling parameters the route takes, read as `/v1/completions` reads them.
const SAMPLING: [&str; 24] = [
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "min_tokens",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "logprobs",
    "n",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "priority",
    "timeout",
];

/// What the request asks for besides its text.
#[derive(Debug, Default, PartialEq)]
struct Asked {
    prompt: String,
    stream: bool,
    /// The prompt leads the answer's text.
    prepend: bool,
    finish_reason: bool,
    input_tokens: bool,
    output_tokens: bool,
    cumulative_logprob: bool,
    /// `return_logprobs`.
    logprobs: bool,
}

/// A request of the contract, read and checked, for one generation model.
pub struct TextRequest {
    asked: Asked,
    generate: Generate,
    /// The tokens' log-probabilities as asked for: each with this many alternatives, or
    /// `None` (`null`) without the sampling parameter `logprobs`.
    logprobs: Option<Option<usize>>,
}

impl TextRequest {
    /// The request a generate extension body (one JSON object) makes of `handle`.
    pub fn from_json(handle: &ModelHandle, body: &[u8]) -> Result<TextRequest, InferError> {
        let Once(given) = serde_json::from_slice::<Once<Value>>(body)
            .map_err(|e| invalid(format!("the generate request is not a JSON object: {e}")))?;
        TextRequest::new(handle, given)
    }

    /// The request a KServe request's tensors and parameters make of `handle`: `text_input`
    /// and `sampling_parameters` as BYTES, the switches as BOOL, each of one element.
    pub fn from_tensors(handle: &ModelHandle, raw: &RawRequest) -> Result<TextRequest, InferError> {
        let mut given: Vec<(String, Value)> = Vec::new();
        for t in &raw.byte_inputs {
            let [item] = t.items.as_slice() else {
                return Err(invalid(format!(
                    "input '{}': one element, not {}",
                    t.name,
                    t.items.len()
                )));
            };
            let text = std::str::from_utf8(item)
                .map_err(|_| invalid(format!("input '{}': not UTF-8 text", t.name)))?;
            given.push((t.name.clone(), json!(text)));
        }
        for input in &raw.inputs {
            let (name, tensor) = (&input.name, &input.tensor);
            if tensor.dtype() != DataType::Bool || tensor.data().len() != 1 {
                return Err(invalid(format!(
                    "input '{name}': a generation model takes text rather than tensors: the \
                     inputs of Triton's vLLM backend, text_input and sampling_parameters (BYTES) \
                     and the switches {} (BOOL), each of one element, or POST \
                     /v1/chat/completions or /v1/completions",
                    SWITCHES.join(", ")
                )));
            }
            given.push((name.clone(), json!(tensor.data()[0] != 0)));
        }
        if let Some(parameters) = &raw.parameters {
            // Names with Triton's prefix are the server's (such as the stream's
            // `triton_enable_empty_final_response`), not sampling parameters.
            let sampling: Map<String, Value> = parameters
                .iter()
                .filter(|(name, _)| !name.starts_with("triton_"))
                .map(|(name, value)| (name.clone(), value.clone()))
                .collect();
            given.push(("parameters".into(), Value::Object(sampling)));
        }
        let mut request = TextRequest::new(handle, given)?;
        // The request parameters the server reads itself.
        if raw.priority.is_some() {
            request.generate.priority = raw.priority;
        }
        if raw.timeout_us.is_some() {
            request.generate.timeout_us = raw.timeout_us;
        }
        Ok(request)
    }

    fn new(handle: &ModelHandle, given: Vec<(String, Value)>) -> Result<TextRequest, InferError> {
        let (asked, fields) = read(given)?;
        let context = handle.generator()?.info().context_length;
        let mut generate = request(&handle.name, &asked, fields, context)?;
        let logprobs = asked.logprobs.then_some(generate.request.logprobs);
        // Each generated token's log-probability: summed, or counted while streaming.
        if asked.cumulative_logprob || (asked.stream && asked.output_tokens) {
            generate.request.logprobs.get_or_insert(0);
        }
        Ok(TextRequest {
            asked,
            generate,
            logprobs,
        })
    }

    /// Whether the answer comes in pieces (`stream: true`).
    pub fn streams(&self) -> bool {
        self.asked.stream
    }
}

/// One answer: for each of the request's outputs (`n`, one unless asked), its text and what the
/// request asked for besides. Each list holds one entry per output.
#[derive(Debug, Clone, PartialEq)]
pub struct TextAnswer {
    /// Streamed: each output's new text, empty for an output this answer does not move.
    pub texts: Vec<String>,
    /// Asked for: none until an output has ended, then `stop` or `length`.
    pub finish_reasons: Option<Vec<Option<&'static str>>>,
    pub num_input_tokens: Option<usize>,
    /// Each output's tokens (streamed: this answer's own).
    pub num_output_tokens: Option<Vec<usize>>,
    pub cumulative_logprobs: Option<Vec<f64>>,
    /// Asked for: each output's tokens (streamed: this answer's own) with their
    /// log-probabilities, as JSON text.
    pub logprobs: Option<Vec<String>>,
}

/// Submits `request` to `handle`'s engine. A request refused, or failing before its first
/// answer, is an error here; later errors end the stream.
pub async fn run(
    state: &AppState,
    handle: &ModelHandle,
    request: TextRequest,
) -> Result<BoxStream<'static, Result<TextAnswer, InferError>>, InferError> {
    let TextRequest {
        asked,
        generate,
        logprobs,
    } = request;
    let n = generate.choices;
    // Checked before anything is made for them.
    sheaf_core::generate::check_choices(n, handle.generator()?.info().max_choices)?;
    let input_tokens = match asked.stream && asked.input_tokens {
        true => Some(
            handle
                .tokenize(&generate.request.prompt, generate.request.rendering)?
                .len(),
        ),
        false => None,
    };
    let mut timing = Timing::start(state, &handle.name);
    // The outputs' events, merged and tagged with the output's index.
    let mut events = merged(handle.generate(generate)?);
    let mut counts = Counts {
        asked,
        input_tokens,
        logprobs,
        outputs: (0..n).map(|_| Output::default()).collect(),
    };
    if !counts.asked.stream {
        let mut texts = vec![String::new(); n];
        while counts.outputs.iter().any(|o| o.ended.is_none()) {
            match events.next().await {
                Some((i, Event::Text(t))) => {
                    timing.text();
                    if let Some(text) = texts.get_mut(i) {
                        text.push_str(&t);
                    }
                }
                Some((i, Event::Logprob(t))) => counts.token(i, t),
                Some((_, Event::PromptLogprobs(_))) => {}
                Some((i, Event::Done(reason, usage))) => counts.end(i, reason, usage),
                Some((_, Event::Error(e))) => return Err(e.into()),
                None => return Err(InferError::internal("the engine dropped the request")),
            }
        }
        if counts.asked.prepend {
            for text in &mut texts {
                text.insert_str(0, &counts.asked.prompt);
            }
        }
        let one = counts.answer(texts);
        return Ok(futures::stream::iter([Ok(one)]).boxed());
    }
    // An error before any text (a prompt longer than the context) fails the request.
    let first = events.next().await;
    if let Some((_, Event::Error(e))) = first {
        return Err(e.into());
    }
    if let Some((_, Event::Text(_))) = first {
        timing.text();
    }
    let rest = timed(events, timing, state.drain.clone());
    let events = futures::stream::iter(first).chain(rest);
    let answers = futures::stream::unfold(
        (Box::pin(events), counts, false),
        |(mut events, mut counts, ended)| async move {
            if ended {
                return None;
            }
            loop {
                let (i, piece) = match events.next().await? {
                    (i, Event::Text(t)) => (i, t),
                    (i, Event::Logprob(t)) => {
                        counts.token(i, t);
                        continue;
                    }
                    (_, Event::PromptLogprobs(_)) => continue,
                    (i, Event::Done(reason, usage)) => {
                        counts.end(i, reason, usage);
                        (i, String::new())
                    }
                    (_, Event::Error(e)) => return Some((Err(e.into()), (events, counts, true))),
                };
                let mut texts = vec![String::new(); counts.outputs.len()];
                if let Some(text) = texts.get_mut(i) {
                    *text = piece;
                }
                let last = counts.outputs.iter().all(|o| o.ended.is_some());
                return Some((Ok(counts.answer(texts)), (events, counts, last)));
            }
        },
    );
    Ok(answers.boxed())
}

/// The one answer of a request without `stream`.
pub async fn run_once(
    state: &AppState,
    handle: &ModelHandle,
    request: TextRequest,
) -> Result<TextAnswer, InferError> {
    let mut answers = run(state, handle, request).await?;
    answers
        .next()
        .await
        .unwrap_or_else(|| Err(InferError::internal("the engine gave no answer")))
}

/// What the answers' counts stand at.
struct Counts {
    asked: Asked,
    /// The prompt's tokens, counted before a streamed answer begins; else from the usage.
    input_tokens: Option<usize>,
    /// As [`TextRequest::logprobs`].
    logprobs: Option<Option<usize>>,
    outputs: Vec<Output>,
}

/// Where one output stands.
#[derive(Default)]
struct Output {
    /// Generated tokens seen so far: each token's log-probability counts it, and the end of
    /// the sequence sets the engine's count (the end token included, which has none).
    counted: usize,
    /// Of those, the ones earlier answers reported.
    reported: usize,
    cumulative: f64,
    /// Tokens no answer has shown yet, where their log-probabilities are asked for.
    pending: Vec<TokenLogprob>,
    ended: Option<FinishReason>,
}

impl Counts {
    /// A token of output `i`, seen by its log-probability.
    fn token(&mut self, i: usize, t: TokenLogprob) {
        let keep = matches!(self.logprobs, Some(Some(_)));
        if let Some(o) = self.outputs.get_mut(i) {
            o.counted += 1;
            o.cumulative += f64::from(t.chosen.logprob);
            if keep {
                o.pending.push(t);
            }
        }
    }

    /// Output `i` has ended, with the engine's counts.
    fn end(&mut self, i: usize, reason: FinishReason, usage: Usage) {
        self.input_tokens = Some(usage.prompt_tokens);
        if let Some(o) = self.outputs.get_mut(i) {
            o.counted = usage.completion_tokens;
            o.ended = Some(reason);
        }
    }

    /// An answer with `texts`, one per output, and for each what was asked for since the
    /// last answer (its tokens, their log-probabilities) or so far (its reason, its sum).
    fn answer(&mut self, texts: Vec<String>) -> TextAnswer {
        let asked = &self.asked;
        let outputs = &mut self.outputs;
        let logprobs = self.logprobs.map(|top| {
            outputs
                .iter_mut()
                .map(|o| {
                    let tokens = std::mem::take(&mut o.pending);
                    match top {
                        None => "null".to_string(),
                        Some(top) => Value::Array(positions(&tokens, top).collect()).to_string(),
                    }
                })
                .collect()
        });
        let output_tokens = asked.output_tokens.then(|| {
            outputs
                .iter_mut()
                .map(|o| {
                    o.counted
                        .saturating_sub(std::mem::replace(&mut o.reported, o.counted))
                })
                .collect()
        });
        TextAnswer {
            texts,
            finish_reasons: asked.finish_reason.then(|| {
                outputs
                    .iter()
                    .map(|o| o.ended.map(FinishReason::as_str))
                    .collect()
            }),
            num_input_tokens: self.input_tokens.filter(|_| asked.input_tokens),
            num_output_tokens: output_tokens,
            cumulative_logprobs: asked
                .cumulative_logprob
                .then(|| outputs.iter().map(|o| o.cumulative).collect()),
            logprobs,
        }
    }
}

fn invalid(message: impl Into<String>) -> InferError {
    InferError::invalid(message)
}

/// The request's text and switches, and its sampling parameters (every other field, from the
/// request, its `parameters` and its `sampling_parameters`), each named once.
fn read(given: Vec<(String, Value)>) -> Result<(Asked, Map<String, Value>), InferError> {
    let mut prompt = None;
    let mut fields = Map::new();
    let add = |fields: &mut Map<String, Value>, name: String, value: Value| {
        if fields.contains_key(&name) {
            return Err(invalid(format!(
                "'{}' is given twice (as a field, in parameters or in sampling_parameters)",
                sheaf_core::clip(&name)
            )));
        }
        fields.insert(name, value);
        Ok(())
    };
    for (name, value) in given {
        match name.as_str() {
            "text_input" => {
                prompt = Some(match value {
                    Value::String(s) => s,
                    Value::Array(mut one) if one.len() == 1 && one[0].is_string() => {
                        match one.pop() {
                            Some(Value::String(s)) => s,
                            _ => String::new(),
                        }
                    }
                    _ => {
                        return Err(invalid(
                            "text_input: the prompt, as a string (or a list of one string)",
                        ))
                    }
                })
            }
            "parameters" => {
                let Once(given) = serde_json::from_value::<Once<Value>>(value)
                    .map_err(|e| invalid(format!("'parameters' must be a JSON object: {e}")))?;
                for (name, value) in given {
                    add(&mut fields, name, value)?;
                }
            }
            "sampling_parameters" => {
                let parsed = match &value {
                    Value::String(s) => serde_json::from_str::<Once<Value>>(s).ok(),
                    _ => None,
                };
                let Some(Once(given)) = parsed else {
                    return Err(invalid(
                        "sampling_parameters: a JSON object written as a string, such as \
                         \"{\\\"temperature\\\": 0}\"",
                    ));
                };
                for (name, value) in given {
                    add(&mut fields, name, value)?;
                }
            }
            _ => add(&mut fields, name, value)?,
        }
    }
    let prompt = prompt.ok_or_else(|| invalid("text_input: missing: the prompt to continue"))?;
    let mut switch = |name: &str| match fields.remove(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(b)),
        Some(other) => Err(invalid(format!("{name}: true or false, not {other}"))),
    };
    let [stream, exclude, finish_reason, input_tokens, output_tokens, cumulative, logprobs] =
        SWITCHES.map(&mut switch);
    let stream = stream?.unwrap_or(false);
    // The prompt leads a whole answer unless excluded; a streamed one never.
    let prepend = exclude?.map_or(!stream, |exclude| !exclude);
    if prepend && stream {
        return Err(invalid(
            "exclude_input_in_output: false is not allowed with stream: true (the pieces of \
             text come without the prompt)",
        ));
    }
    let asked = Asked {
        prompt,
        stream,
        prepend,
        finish_reason: finish_reason?.unwrap_or(false),
        input_tokens: input_tokens?.unwrap_or(false),
        output_tokens: output_tokens?.unwrap_or(false),
        cumulative_logprob: cumulative?.unwrap_or(false),
        logprobs: logprobs?.unwrap_or(false),
    };
    if let Some(name) = fields.keys().find(|k| !SAMPLING.contains(&k.as_str())) {
        let why = match name.as_str() {
            "lora_name" => "sheaf serves no LoRA adapters".to_string(),
            _ => format!(
                "a generation model's Triton requests take text_input, {}, \
                 sampling_parameters, parameters and the sampling parameters {}",
                SWITCHES.join(", "),
                SAMPLING.join(", ")
            ),
        };
        return Err(invalid(format!("'{}': {why}", sheaf_core::clip(name))));
    }
    Ok((asked, fields))
}

/// The generation request: `fields` read as `/v1/completions` reads its own, for `model`,
/// whose context is `context` tokens.
fn request(
    model: &str,
    asked: &Asked,
    mut fields: Map<String, Value>,
    context: usize,
) -> Result<Generate, InferError> {
    fields.insert("model".into(), json!(model));
    fields.insert("prompt".into(), json!(asked.prompt));
    let completion: CompletionRequest = serde_json::from_value(Value::Object(fields))
        .map_err(|e| InferError::invalid(format!("the sampling parameters: {e}")))?;
    let (_, mut requests, _) = completion
        .into_request(context)
        .map_err(InferError::invalid)?;
    match (requests.pop(), requests.is_empty()) {
        (Some(g), true) => match &g.request.prompt {
            Prompt::Text(_) => Ok(g),
            _ => Err(InferError::internal("a text prompt became another kind")),
        },
        _ => Err(InferError::internal("one prompt became several requests")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(body: &str) -> Result<(Asked, Map<String, Value>), InferError> {
        let Once(given) =
            serde_json::from_str::<Once<Value>>(body).map_err(|e| invalid(e.to_string()))?;
        read(given)
    }

    fn asked(body: Value) -> Result<(Asked, Map<String, Value>), String> {
        fields(&body.to_string()).map_err(|e| e.message)
    }

    #[test]
    fn the_switches_and_the_sampling_parameters_come_from_every_place() {
        let (a, fields) = asked(json!({
            "text_input": "Hi",
            "max_tokens": 4,
            "parameters": {"temperature": 0, "return_finish_reason": true},
            "sampling_parameters": "{\"top_k\": 5}",
        }))
        .unwrap();
        assert_eq!(
            a,
            Asked {
                prompt: "Hi".into(),
                prepend: true,
                finish_reason: true,
                ..Default::default()
            }
        );
        assert_eq!(fields.len(), 3, "{fields:?}");
        // Streamed, the prompt is left out unless asked for, which is refused.
        let (a, _) = asked(json!({"text_input": ["Hi"], "stream": true})).unwrap();
        assert!(a.stream && !a.prepend);
        let e =
            asked(json!({"text_input": "Hi", "stream": true, "exclude_input_in_output": false}))
                .unwrap_err();
        assert!(e.starts_with("exclude_input_in_output"), "{e}");
        let (a, _) = asked(json!({"text_input": "Hi", "exclude_input_in_output": true})).unwrap();
        assert!(!a.prepend);
        let (a, fields) =
            asked(json!({"text_input": "Hi", "return_logprobs": true, "logprobs": 2})).unwrap();
        assert!(a.logprobs && fields.contains_key("logprobs"));
    }

    #[test]
    fn what_the_route_does_not_take_is_refused_by_name() {
        for (body, says) in [
            (json!({"max_tokens": 3}), "text_input: missing"),
            (json!({"text_input": 3}), "text_input: the prompt"),
            (
                json!({"text_input": "a", "stream": "yes"}),
                "stream: true or false",
            ),
            (
                json!({"text_input": "a", "echo": true}),
                "'echo': a generation model's Triton requests take",
            ),
            (
                json!({"text_input": "a", "lora_name": "x"}),
                "'lora_name': sheaf serves no",
            ),
            (
                json!({"text_input": "a", "return_logprobs": 1}),
                "return_logprobs: true or false",
            ),
            (
                json!({"text_input": "a", "sampling_parameters": "{"}),
                "sampling_parameters: a JSON",
            ),
            (
                json!({"text_input": "a", "top_k": 1, "parameters": {"top_k": 2}}),
                "'top_k' is given twice",
            ),
            (
                json!({"text_input": "a", "parameters": {"seed": 1}, "sampling_parameters": "{\"seed\": 2}"}),
                "'seed' is given twice",
            ),
        ] {
            let e = asked(body.clone()).unwrap_err();
            assert!(e.starts_with(says), "{body}: {e}");
        }
        let e = fields(r#"{"text_input": "a", "text_input": "b"}"#).unwrap_err();
        assert!(e.message.contains("given twice"), "{}", e.message);
    }

    #[test]
    fn the_sampling_parameters_are_read_as_a_completion_s() {
        let (a, fields) =
            asked(json!({"text_input": "Hi", "max_tokens": 7, "temperature": 0, "stop": "\n"}))
                .unwrap();
        let g = request("m", &a, fields, 100).unwrap();
        assert_eq!(g.request.prompt, Prompt::Text("Hi".into()));
        assert_eq!(g.request.max_tokens, 7);
        assert_eq!(g.request.sampling.temperature, 0.0);
        assert_eq!(g.request.stop, ["\n"]);
        // A completion's default length and its checks.
        let (a, fields) = asked(json!({"text_input": "Hi"})).unwrap();
        assert_eq!(
            request("m", &a, fields, 100).unwrap().request.max_tokens,
            16
        );
        let (a, fields) = asked(json!({"text_input": "Hi", "max_tokens": 500})).unwrap();
        let e = request("m", &a, fields, 100).unwrap_err();
        assert!(e.message.contains("context"), "{}", e.message);
        let (a, fields) = asked(json!({"text_input": "Hi", "temperature": "hot"})).unwrap();
        let e = request("m", &a, fields, 100).unwrap_err();
        assert!(
            e.message.starts_with("the sampling parameters"),
            "{}",
            e.message
        );
    }
}
