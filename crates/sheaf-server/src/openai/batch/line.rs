//! One request of an OpenAI batch file, and its answer as a line of the output: the Batch
//! API's line formats, shared by `POST /v1/batches` and `sheaf run`.
//!
//! A request line is `{"custom_id", "method": "POST", "url", "body"}`; [`parse`] checks it
//! whole before anything runs. [`call`] sends it to the `/v1` routes in process (a router
//! called without a socket), so its answer, or its error with the route's status and error
//! body, is what the server sends for the same body, and renders the output line:
//! `{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error": null}`.

use std::collections::HashMap;

use axum::body::Body;
use axum::Router;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use tower::ServiceExt;

/// The routes a batch request may name.
pub const URLS: [&str; 6] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/embeddings",
    "/v1/score",
    "/v1/rerank",
];

/// One line of an input file, as OpenAI's Batch API defines it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    custom_id: String,
    method: String,
    url: String,
    body: Map<String, Value>,
}

/// One checked request.
#[derive(Debug, Clone)]
pub struct Request {
    pub custom_id: String,
    pub url: String,
    /// The body as sent.
    pub body: Vec<u8>,
}

/// What is wrong with a line: the Batch API's error code, and a message.
#[derive(Debug, Clone, PartialEq)]
pub struct LineError {
    pub code: &'static str,
    pub message: String,
}

impl LineError {
    fn new(code: &'static str, message: impl Into<String>) -> LineError {
        LineError {
            code,
            message: message.into(),
        }
    }
}

/// What a line must agree with.
#[derive(Debug, Clone, Copy, Default)]
pub struct Expect<'a> {
    /// The route every line names (a batch's `endpoint`).
    pub endpoint: Option<&'a str>,
    /// The model every line is for (a `sheaf run` job's): a body naming none gets it, and one
    /// naming another is refused.
    pub model: Option<&'a str>,
}

/// The request of one line, or what is wrong with it.
pub fn parse(line: &str, expect: Expect<'_>) -> Result<Request, LineError> {
    let Input {
        custom_id,
        method,
        url,
        mut body,
    } = serde_json::from_str(line).map_err(|e| {
        LineError::new(
            "invalid_json_line",
            format!(
                "{e}; a batch request is {{\"custom_id\": \"…\", \"method\": \"POST\", \"url\": \
                 \"/v1/…\", \"body\": {{…}}}}"
            ),
        )
    })?;
    if method != "POST" {
        return Err(LineError::new(
            "invalid_method",
            format!("method '{method}': a batch request is a POST"),
        ));
    }
    if !URLS.contains(&url.as_str()) {
        return Err(LineError::new(
            "invalid_url",
            format!(
                "url '{url}' is not a route a batch runs; give one of {}",
                URLS.join(", ")
            ),
        ));
    }
    if let Some(endpoint) = expect.endpoint.filter(|e| *e != url) {
        return Err(LineError::new(
            "mismatched_endpoint",
            format!("url '{url}' is not the batch's endpoint '{endpoint}'"),
        ));
    }
    if body.get("stream").is_some_and(|s| s == &Value::Bool(true)) {
        return Err(LineError::new(
            "invalid_request",
            "body.stream: a batch answers each request whole; leave it out",
        ));
    }
    if let Some(model) = expect.model {
        match body.get("model") {
            None => {
                body.insert("model".into(), Value::String(model.into()));
            }
            Some(Value::String(named)) if named != model => {
                return Err(LineError::new(
                    "mismatched_model",
                    format!(
                        "body.model '{named}' is not this job's model '{model}'; name it or \
                         leave it out"
                    ),
                ))
            }
            // The route answers a model that is not a string, as the server does.
            Some(_) => {}
        }
    }
    let body = serde_json::to_vec(&body)
        .map_err(|e| LineError::new("invalid_json_line", e.to_string()))?;
    Ok(Request {
        custom_id,
        url,
        body,
    })
}

/// The requests of a whole file, or its first `most` faults, each with its line number
/// (from 1): a line [`parse`] refuses, or a `custom_id` given twice.
pub fn parse_all(
    text: &str,
    expect: Expect<'_>,
    most: usize,
) -> Result<Vec<Request>, Vec<(usize, LineError)>> {
    let mut requests = Vec::new();
    let mut faults = Vec::new();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        match parse(line, expect) {
            Ok(request) => requests.push((n + 1, request)),
            Err(e) => faults.push((n + 1, e)),
        }
        if faults.len() >= most {
            return Err(faults);
        }
    }
    for (n, request) in &requests {
        if let Some(first) = seen.insert(&request.custom_id, *n) {
            let message = format!(
                "custom_id '{}' is on line {first} too; each request needs its own",
                request.custom_id
            );
            faults.push((*n, LineError::new("duplicate_custom_id", message)));
            if faults.len() >= most {
                break;
            }
        }
    }
    if !faults.is_empty() {
        faults.sort_by_key(|(n, _)| *n);
        return Err(faults);
    }
    Ok(requests.into_iter().map(|(_, r)| r).collect())
}

/// One request's answer, rendered as its output line.
pub struct Answered {
    pub line: Vec<u8>,
    /// Whether the route answered with a success status.
    pub ok: bool,
    /// The tokens its answer's `usage` counts.
    pub tokens: Tokens,
}

/// Tokens read and written, as an answer's `usage` counts them, summed over a batch.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tokens {
    pub input: u64,
    pub output: u64,
    /// Input tokens whose state came from the cache of an earlier prompt.
    pub cached: u64,
}

impl Tokens {
    /// The tokens a route's answer body counts in its `usage`: the completion routes'
    /// `prompt_tokens` and `completion_tokens`, the Responses API's `input_tokens` and
    /// `output_tokens`, an encoder's `prompt_tokens`; none in a body without one.
    pub fn of(body: &[u8]) -> Tokens {
        #[derive(Deserialize)]
        struct Answer {
            usage: Option<Usage>,
        }
        #[derive(Deserialize)]
        struct Usage {
            #[serde(alias = "input_tokens")]
            prompt_tokens: Option<u64>,
            #[serde(alias = "output_tokens")]
            completion_tokens: Option<u64>,
            #[serde(alias = "input_tokens_details")]
            prompt_tokens_details: Option<Details>,
        }
        #[derive(Deserialize)]
        struct Details {
            cached_tokens: Option<u64>,
        }
        let Ok(Answer { usage: Some(usage) }) = serde_json::from_slice::<Answer>(body) else {
            return Tokens::default();
        };
        Tokens {
            input: usage.prompt_tokens.unwrap_or(0),
            output: usage.completion_tokens.unwrap_or(0),
            cached: usage
                .prompt_tokens_details
                .and_then(|d| d.cached_tokens)
                .unwrap_or(0),
        }
    }

    pub fn add(&mut self, other: Tokens) {
        self.input += other.input;
        self.output += other.output;
        self.cached += other.cached;
    }

    /// The Batch object's `usage`.
    pub fn json(&self) -> Value {
        serde_json::json!({
            "input_tokens": self.input,
            "input_tokens_details": {"cached_tokens": self.cached},
            "output_tokens": self.output,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": self.input + self.output,
        })
    }
}

/// Sends `request` to `routes` (the `/v1` routes over the server's state) and renders its
/// answer; `id` names the output line (`request_id` is `req_` and the same).
pub async fn call(routes: &Router, id: &str, request: &Request) -> Answered {
    let sent = axum::http::Request::post(&request.url)
        .header(axum::http::header::CONTENT_TYPE, "application/json")
        .body(Body::from(request.body.clone()));
    let answered = match sent {
        Ok(sent) => match routes.clone().oneshot(sent).await {
            Ok(response) => {
                let status = response.status();
                axum::body::to_bytes(response.into_body(), usize::MAX)
                    .await
                    .map(|body| (status, body))
                    .map_err(|e| e.to_string())
            }
            Err(never) => match never {},
        },
        Err(e) => Err(e.to_string()),
    };
    let (line, ok, tokens) = match answered {
        Ok((status, body)) => (
            answer_line(id, &request.custom_id, status.as_u16(), &body),
            status.is_success(),
            Tokens::of(&body),
        ),
        Err(message) => (
            error_line(id, &request.custom_id, &message),
            false,
            Tokens::default(),
        ),
    };
    Answered { line, ok, tokens }
}

/// One line of the output file, as OpenAI's Batch API defines it.
#[derive(Serialize)]
struct Output<'a> {
    id: &'a str,
    custom_id: &'a str,
    response: Option<Response>,
    /// Why no response came, where none did.
    error: Option<Value>,
}

#[derive(Serialize)]
struct Response {
    status_code: u16,
    request_id: String,
    body: Box<RawValue>,
}

impl Output<'_> {
    fn line(&self) -> Vec<u8> {
        // Every part is a string, a number or valid JSON: this cannot fail.
        let mut line = serde_json::to_vec(self).unwrap_or_default();
        line.push(b'\n');
        line
    }
}

/// The output line of an answer: its status and body (a body that is not JSON, as a string).
fn answer_line(id: &str, custom_id: &str, status: u16, body: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(body);
    let body = match serde_json::from_str::<&RawValue>(&text) {
        Ok(raw) => raw.to_owned(),
        Err(_) => serde_json::value::to_raw_value(&text).unwrap_or_default(),
    };
    Output {
        id,
        custom_id,
        response: Some(Response {
            status_code: status,
            request_id: format!("req_{id}"),
            body,
        }),
        error: None,
    }
    .line()
}

/// The output line of a request no answer came for: no response, and the error.
fn error_line(id: &str, custom_id: &str, message: &str) -> Vec<u8> {
    Output {
        id,
        custom_id,
        response: None,
        error: Some(serde_json::json!({"code": "internal_error", "message": message})),
    }
    .line()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(url: &str, body: Value) -> Value {
        serde_json::json!({"custom_id": "a", "method": "POST", "url": url, "body": body})
    }

    fn job(line: Value) -> Result<Request, LineError> {
        let expect = Expect {
            endpoint: None,
            model: Some("smollm2"),
        };
        parse(&line.to_string(), expect)
    }

    #[test]
    fn an_answer_s_tokens_are_read_from_each_route_s_usage() {
        let chat = br#"{"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10, "prompt_tokens_details": {"cached_tokens": 4}}}"#;
        let want = Tokens {
            input: 7,
            output: 3,
            cached: 4,
        };
        assert_eq!(Tokens::of(chat), want);
        let responses = br#"{"output": [], "usage": {"input_tokens": 7, "output_tokens": 3, "input_tokens_details": {"cached_tokens": 4}}}"#;
        assert_eq!(Tokens::of(responses), want);
        let embeddings = br#"{"data": [{"embedding": [0.5]}], "usage": {"prompt_tokens": 5, "total_tokens": 5}}"#;
        assert_eq!(Tokens::of(embeddings).input, 5);
        assert_eq!(Tokens::of(embeddings).output, 0);
        assert_eq!(
            Tokens::of(br#"{"error": {"message": "no"}}"#),
            Tokens::default()
        );
        assert_eq!(Tokens::of(b"not json"), Tokens::default());
        let mut sum = want;
        sum.add(want);
        let usage = sum.json();
        assert_eq!(usage["input_tokens"], 14);
        assert_eq!(usage["output_tokens"], 6);
        assert_eq!(usage["total_tokens"], 20);
        assert_eq!(usage["input_tokens_details"]["cached_tokens"], 8);
    }

    #[test]
    fn a_request_gets_the_job_s_model_where_it_names_none() {
        let r = job(line("/v1/completions", serde_json::json!({"prompt": "hi"}))).unwrap();
        let body: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(body["model"], "smollm2");
        assert_eq!(body["prompt"], "hi");
        let named = serde_json::json!({"model": "smollm2", "messages": []});
        assert!(job(line("/v1/chat/completions", named)).is_ok());
        // Without a job's model, the body goes as it is.
        let r = parse(
            &line("/v1/completions", serde_json::json!({})).to_string(),
            Expect::default(),
        )
        .unwrap();
        assert_eq!(r.body, b"{}");
    }

    #[test]
    fn requests_no_route_can_answer_whole_are_refused() {
        let code = |l: Value| job(l).unwrap_err().code;
        assert_eq!(
            code(line("/v1/completions", serde_json::json!({"stream": true}))),
            "invalid_request"
        );
        assert!(job(line(
            "/v1/completions",
            serde_json::json!({"stream": false})
        ))
        .is_ok());
        let e = job(line("/v2/models/m/infer", serde_json::json!({}))).unwrap_err();
        assert!(
            e.message.contains("/v1/chat/completions, /v1/completions"),
            "{e:?}"
        );
        let e = job(line(
            "/v1/completions",
            serde_json::json!({"model": "gpt-4o"}),
        ))
        .unwrap_err();
        assert!(
            e.message
                .contains("'gpt-4o' is not this job's model 'smollm2'"),
            "{e:?}"
        );
        let mut get = line("/v1/completions", serde_json::json!({}));
        get["method"] = "GET".into();
        assert_eq!(code(get), "invalid_method");
        let mut extra = line("/v1/completions", serde_json::json!({}));
        extra["priority"] = 1.into();
        assert!(job(extra)
            .unwrap_err()
            .message
            .contains("unknown field `priority`"));
        let endpoint = Expect {
            endpoint: Some("/v1/embeddings"),
            model: None,
        };
        let e = parse(
            &line("/v1/completions", serde_json::json!({})).to_string(),
            endpoint,
        );
        assert_eq!(e.unwrap_err().code, "mismatched_endpoint");
    }

    #[test]
    fn a_file_s_faults_come_with_their_line_numbers() {
        let ok = line("/v1/completions", serde_json::json!({})).to_string();
        let text = format!("{ok}\n\nnot json\n{ok}\n");
        let faults = parse_all(&text, Expect::default(), 10).unwrap_err();
        let found: Vec<(usize, &str)> = faults.iter().map(|(n, e)| (*n, e.code)).collect();
        assert_eq!(
            found,
            [(3, "invalid_json_line"), (4, "duplicate_custom_id")]
        );
        assert!(faults[1].1.message.contains("on line 1 too"));
        assert_eq!(parse_all(&text, Expect::default(), 1).unwrap_err().len(), 1);
        assert_eq!(
            parse_all(&format!("{ok}\n"), Expect::default(), 1)
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn an_answer_that_is_not_json_is_kept_as_a_string() {
        let line = answer_line("b3", "x", 413, b"too large");
        let v: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(v["response"]["body"], "too large");
        assert_eq!(v["response"]["status_code"], 413);
        assert_eq!(v["response"]["request_id"], "req_b3");
        assert_eq!(v["id"], "b3");
        let line = answer_line("b0", "y", 200, br#"{"a": [1, 2]}"#);
        let v: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(v["response"]["body"]["a"][1], 2);
        assert!(v["error"].is_null());
        let v: Value = serde_json::from_slice(&error_line("b1", "z", "gone")).unwrap();
        assert!(v["response"].is_null());
        assert_eq!(v["error"]["message"], "gone");
    }
}
