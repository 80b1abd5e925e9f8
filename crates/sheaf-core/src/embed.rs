//! Text embeddings: a model whose `config.yaml` has an `embedding` section is a text encoder.
//!
//! [`TextEncoder`] holds the model's tokenizer and turns each text of an [`EmbedRequest`] into
//! the encoder's inputs (token ids, attention mask, segment ids). Each text then goes through the
//! model's queue as one item of its own length, so the batcher groups texts of similar length
//! from every request into one padded batch, bounded by the model's token budget. The instances
//! pool the token states into one vector per text ([`sheaf_backend::Pooled`]); this module cuts
//! it to the requested `dimensions` and normalises it. The answer ([`Embeddings`]) is built once
//! here, and each protocol (OpenAI's `/v1/embeddings`, TEI's `/embed`) only renders it; so are
//! the token states themselves, where a request asks for them instead of the vector
//! ([`TokenEmbeddings`]: TEI's `/embed_all`; each request reads only the output it asks for, so
//! neither pays for the other), the scores of texts against others ([`Embeddings::scores`]:
//! TEI's `/similarity`, vLLM's `/score`) and their order by score ([`ranked`]: vLLM's, Jina's
//! and Cohere's `/rerank`), and the description of the encoder itself ([`EncoderInfo`]: TEI's
//! `/info`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sheaf_backend::{DataType, Signature, Tensor};
use tokenizers::{
    PostProcessor, Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy,
};

use crate::config::{EmbeddingConfig, PoolingConfig};
use crate::request::{NamedTensor, RawRequest};
use crate::InferError;

/// Most inputs one request may hold (OpenAI's limit for `/v1/embeddings`).
pub const MAX_INPUTS: usize = 2048;

/// The most bytes of FP32 token states one answer holds ([`crate::ModelHandle::embed_tokens`]):
/// states are tokens × hidden floats, and as JSON about three times that, so a request of a
/// few kilobytes could otherwise ask for gigabytes.
pub const MAX_TOKEN_STATES_BYTES: usize = 16 << 20;

/// Texts whose bytes add up to more than this are tokenised on a blocking thread rather than
/// on the request's task.
const INLINE_TOKENIZE_BYTES: usize = 2048;

/// What to embed: texts, or texts already tokenised (token ids, used as they are).
#[derive(Debug, Clone, PartialEq)]
pub enum EmbedInput {
    Texts(Vec<String>),
    Tokens(Vec<Vec<u32>>),
}

impl EmbedInput {
    pub fn len(&self) -> usize {
        match self {
            EmbedInput::Texts(t) => t.len(),
            EmbedInput::Tokens(t) => t.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One embeddings request, in protocol-neutral terms.
#[derive(Debug, Clone)]
pub struct EmbedRequest {
    pub input: EmbedInput,
    /// Scale each vector to unit length; none: the model's `embedding.normalize`.
    pub normalize: Option<bool>,
    /// Cut inputs longer than the model takes; none: the model's `embedding.truncate`.
    pub truncate: Option<bool>,
    /// Which end of an input is cut when it is (TEI's `truncation_direction`).
    pub truncation_side: TruncationSide,
    /// Cut each input at this many tokens, special tokens included, rather than at the
    /// model's limit (vLLM's `truncate_prompt_tokens: k`); when set, inputs are cut whatever
    /// `truncate` says. More than the model takes, or too few to leave room for the text
    /// beside the special tokens the model adds, is refused.
    pub truncate_to: Option<usize>,
    /// The size of each vector; none: the model's full size.
    pub dimensions: Option<usize>,
    /// The model's prompt put before each text (TEI's `prompt_name`); none: its default
    /// prompt, if it has one ([`TextEncoder::prompt`]).
    pub prompt_name: Option<String>,
    pub priority: Option<u64>,
    pub timeout_us: Option<u64>,
}

impl EmbedRequest {
    /// A request for `input` with the model's defaults.
    pub fn new(input: EmbedInput) -> EmbedRequest {
        EmbedRequest {
            input,
            normalize: None,
            truncate: None,
            truncation_side: TruncationSide::Right,
            truncate_to: None,
            dimensions: None,
            prompt_name: None,
            priority: None,
            timeout_us: None,
        }
    }
}

/// Which end of a text longer than the model takes is cut: its end (`Right`, the default) or
/// its start (`Left`, which keeps the last tokens). Special tokens stay where the model puts
/// them either way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TruncationSide {
    #[default]
    Right,
    Left,
}

/// Where a request's inputs are cut: at `tokens` (special tokens included), on `side`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut {
    pub side: TruncationSide,
    pub tokens: usize,
}

impl TruncationSide {
    /// TEI's names, `Right` and `Left`, in any case; none for another word.
    pub fn parse(name: &str) -> Option<TruncationSide> {
        if name.eq_ignore_ascii_case("right") {
            Some(TruncationSide::Right)
        } else if name.eq_ignore_ascii_case("left") {
            Some(TruncationSide::Left)
        } else {
            None
        }
    }
}

/// The answer: one vector per input, in input order.
#[derive(Debug, Clone, PartialEq)]
pub struct Embeddings {
    pub model_name: String,
    pub model_version: String,
    pub vectors: Vec<Vec<f32>>,
    /// Tokens the inputs held, special tokens included (OpenAI's `usage.prompt_tokens`).
    pub tokens: usize,
    /// Where the request's time went (TEI's gRPC `Metadata`).
    pub times: EmbedTimes,
}

/// The answer to a request for token states ([`crate::ModelHandle::embed_tokens`]): per
/// input, in input order, one vector per token.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenEmbeddings {
    pub model_name: String,
    pub model_version: String,
    pub states: Vec<Vec<Vec<f32>>>,
    /// Tokens the inputs held, special tokens included.
    pub tokens: usize,
    pub times: EmbedTimes,
}

/// Where an embeddings request's time went. Its texts are queued and run together, so the
/// queue and inference times are those of the text that took longest in each.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EmbedTimes {
    /// Turning the texts into token ids.
    pub tokenization: Duration,
    /// The longest any text waited in the model's queue.
    pub queue: Duration,
    /// The longest the backend took over a batch that held one of the texts.
    pub inference: Duration,
}

impl Embeddings {
    /// Scores of the first `queries` vectors against the vectors after them, by cosine
    /// similarity, in order. One query is scored against every other vector (a source sentence
    /// against the sentences it is compared with, a query against documents); several are each
    /// scored against the vector at their own place among the others (pairs), and a query
    /// without its pair scores nothing.
    pub fn scores(&self, queries: usize) -> Vec<f32> {
        let (queries, others) = self.vectors.split_at(queries.min(self.vectors.len()));
        match queries {
            [one] => others.iter().map(|v| cosine(one, v)).collect(),
            many => many.iter().zip(others).map(|(a, b)| cosine(a, b)).collect(),
        }
    }
}

/// The texts of a request that scores one text against others (a query against documents, a
/// sentence against sentences), the one first, as [`Embeddings::scores`] takes them. `names`
/// are the two fields as the protocol calls them, and `to` what the request does with them
/// (`rank`, `compare`): an empty text, or no others, is refused naming its field.
pub fn one_against_others(
    one: String,
    others: impl ExactSizeIterator<Item = String>,
    (one_name, others_name): (&str, &str),
    to: &str,
) -> Result<Vec<String>, InferError> {
    if one.is_empty() {
        return Err(InferError::invalid(format!(
            "`{one_name}` is an empty string: there is nothing to {to}"
        )));
    }
    if others.len() == 0 {
        return Err(InferError::invalid(format!(
            "`{others_name}` is an empty list: there is nothing to {to}"
        )));
    }
    let mut texts = Vec::with_capacity(others.len() + 1);
    texts.push(one);
    for (i, text) in others.enumerate() {
        if text.is_empty() {
            return Err(InferError::invalid(format!(
                "`{others_name}`[{i}] is an empty string: there is nothing to {to}"
            )));
        }
        texts.push(text);
    }
    Ok(texts)
}

/// The places of `scores` with their scores, highest first (equal scores in their given
/// order), the first `top` of them; `top` 0: all.
pub fn ranked(scores: &[f32], top: usize) -> Vec<(usize, f32)> {
    let mut order: Vec<(usize, f32)> = scores.iter().copied().enumerate().collect();
    order.sort_by(|a, b| b.1.total_cmp(&a.1));
    if top > 0 {
        order.truncate(top);
    }
    order
}

/// The cosine of the angle between `a` and `b`, summed in f64; 0 where either has no length.
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let (mut dot, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (f64::from(x), f64::from(y));
        dot += x * y;
        aa += x * x;
        bb += y * y;
    }
    if aa == 0.0 || bb == 0.0 {
        return 0.0;
    }
    (dot / (aa.sqrt() * bb.sqrt())) as f32
}

/// One token of a text ([`TextEncoder::tokens`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextToken {
    pub id: u32,
    /// The text's bytes the token stands for; a special token's own name.
    pub text: String,
    /// Whether the tokenizer added it (`[CLS]`, `[SEP]`), rather than read it from the text.
    pub special: bool,
    /// Where the token lies in the text's bytes, `start..stop`; none for a special token.
    pub span: Option<(usize, usize)>,
}

/// What fills one encoder input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fill {
    Ids,
    Mask,
    /// Segment ids: one segment, all zeros.
    Zeros,
}

/// A text encoder's tokenizer and how its token ids become the model's inputs.
pub struct TextEncoder {
    /// Without truncation: the length of an input is checked against the limit.
    exact: Tokenizer,
    /// Truncating at the limit, for requests that allow it: cutting the end, and cutting the
    /// start.
    truncating: Tokenizer,
    truncating_left: Tokenizer,
    config: EmbeddingConfig,
    /// One per model input, in signature order.
    fills: Vec<(Fill, DataType)>,
    /// Token ids at or past this are refused (they would index past the embedding table).
    vocab: usize,
    /// The pooled vector's size; none when the model leaves it dynamic.
    dimension: Option<usize>,
}

impl std::fmt::Debug for TextEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextEncoder")
            .field("config", &self.config)
            .field("vocab", &self.vocab)
            .field("dimension", &self.dimension)
            .finish()
    }
}

/// Where the tokenizer of the model file `model` is: next to it, or else in the model folder
/// above its version folder.
pub fn tokenizer_path(model: &Path, config: &EmbeddingConfig) -> PathBuf {
    beside_or_above(model, &config.tokenizer)
}

/// The file `name` next to the model file `model`, or else in the model folder above its
/// version folder.
fn beside_or_above(model: &Path, name: &str) -> PathBuf {
    let beside = model.with_file_name(name);
    match model.parent().and_then(Path::parent) {
        Some(folder) if !beside.exists() => folder.join(name),
        _ => beside,
    }
}

/// sentence-transformers' settings file, whose `prompts` and `default_prompt_name` are read
/// where the config names none.
const SENTENCE_TRANSFORMERS: &str = "config_sentence_transformers.json";

/// `config` with the prompts and the default prompt of the model's
/// `config_sentence_transformers.json` where it names none, and its default prompt checked to
/// be one of its prompts.
fn with_prompts(model: &Path, config: &EmbeddingConfig) -> Result<EmbeddingConfig, String> {
    #[derive(Default, serde::Deserialize)]
    #[serde(default)]
    struct Saved {
        prompts: std::collections::BTreeMap<String, String>,
        default_prompt_name: Option<String>,
    }
    let mut config = config.clone();
    let path = beside_or_above(model, SENTENCE_TRANSFORMERS);
    let unset = config.prompts.is_empty() || config.default_prompt_name.is_none();
    if unset && path.is_file() {
        let saved: Saved = std::fs::read_to_string(&path)
            .map_err(|e| e.to_string())
            .and_then(|text| serde_json::from_str(&text).map_err(|e| e.to_string()))
            .map_err(|e| format!("cannot read {SENTENCE_TRANSFORMERS}: {e}"))?;
        if config.prompts.is_empty() {
            config.prompts = saved.prompts;
        }
        if config.default_prompt_name.is_none() {
            config.default_prompt_name = saved.default_prompt_name;
        }
    }
    match &config.default_prompt_name {
        Some(name) if !config.prompts.contains_key(name) => Err(format!(
            "embedding.default_prompt_name '{name}' is not one of its prompts ({})",
            prompt_names(&config)
        )),
        _ => Ok(config),
    }
}

/// The names of `config`'s prompts, for messages: `a, b`, or `none`.
fn prompt_names(config: &EmbeddingConfig) -> String {
    if config.prompts.is_empty() {
        return "none".into();
    }
    let names: Vec<&str> = config.prompts.keys().map(String::as_str).collect();
    names.join(", ")
}

impl TextEncoder {
    /// Loads the tokenizer for the model file `model` and checks that the pooled model's
    /// `signature` takes inputs this encoder can fill.
    pub fn load(
        model: &Path,
        config: &EmbeddingConfig,
        signature: &Signature,
    ) -> Result<TextEncoder, String> {
        let config = &with_prompts(model, config)?;
        let path = tokenizer_path(model, config);
        let mut exact = Tokenizer::from_file(&path)
            .map_err(|e| format!("cannot read the tokenizer {}: {e}", path.display()))?;
        exact.with_padding(None);
        exact
            .with_truncation(None)
            .map_err(|e| format!("tokenizer {}: {e}", path.display()))?;
        let truncating_at = |direction| {
            let mut t = exact.clone();
            t.with_truncation(Some(TruncationParams {
                direction,
                max_length: config.max_input_tokens,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
            }))
            .map_err(|e| format!("tokenizer {}: {e}", path.display()))?;
            Ok::<_, String>(t)
        };
        let truncating = truncating_at(TruncationDirection::Right)?;
        let truncating_left = truncating_at(TruncationDirection::Left)?;
        let fills = signature
            .inputs
            .iter()
            .map(|s| {
                let fill = match s.name.as_str() {
                    "input_ids" => Fill::Ids,
                    "token_type_ids" => Fill::Zeros,
                    n if n == config.mask_input => Fill::Mask,
                    other => {
                        return Err(format!(
                            "embedding model input '{other}' is none of 'input_ids', '{}', \
                             'token_type_ids'",
                            config.mask_input
                        ))
                    }
                };
                if !matches!(s.dtype, DataType::I64 | DataType::I32) || s.shape.len() != 2 {
                    return Err(format!(
                        "embedding model input '{}' must be INT64 or INT32 of shape [batch, \
                         tokens], not {} {:?}",
                        s.name, s.dtype, s.shape
                    ));
                }
                Ok((fill, s.dtype))
            })
            .collect::<Result<Vec<_>, String>>()?;
        if !fills.iter().any(|f| f.0 == Fill::Ids) {
            return Err("an embedding model needs an 'input_ids' input".into());
        }
        let dimension = signature
            .outputs
            .first()
            .and_then(|o| o.shape.get(1))
            .and_then(|&d| usize::try_from(d).ok());
        Ok(TextEncoder {
            vocab: exact.get_vocab_size(true),
            exact,
            truncating,
            truncating_left,
            config: config.clone(),
            fills,
            dimension,
        })
    }

    /// The full size of the model's vectors, when the model declares it.
    pub fn dimension(&self) -> Option<usize> {
        self.dimension
    }

    /// Most tokens one input may hold.
    pub fn max_input_tokens(&self) -> usize {
        self.config.max_input_tokens
    }

    /// The vector size a request asking for `asked` gets.
    fn dimensions(&self, asked: Option<usize>) -> Result<Option<usize>, InferError> {
        match (asked, self.dimension) {
            (None, _) => Ok(None),
            (Some(d), Some(full)) if d == full => Ok(None),
            (Some(d), _) if self.config.dimensions.contains(&d) => Ok(Some(d)),
            (Some(d), full) => {
                let mut sizes: Vec<String> = full.iter().map(|f| f.to_string()).collect();
                sizes.extend(self.config.dimensions.iter().map(|s| s.to_string()));
                Err(InferError::invalid(format!(
                    "`dimensions` {d} is not a size this model gives; it gives {}",
                    if sizes.is_empty() {
                        "only its full size".to_string()
                    } else {
                        sizes.join(", ")
                    }
                )))
            }
        }
    }

    /// The text put before each text of a request that names `prompt_name`, or that names
    /// none (the default prompt, if the model has one); a name the model has no prompt of is
    /// refused, listing those it has.
    pub fn prompt(&self, prompt_name: Option<&str>) -> Result<Option<&str>, InferError> {
        let Some(name) = prompt_name.or(self.config.default_prompt_name.as_deref()) else {
            return Ok(None);
        };
        match self.config.prompts.get(name) {
            Some(prompt) => Ok(Some(prompt)),
            None if self.config.prompts.is_empty() => Err(InferError::invalid(format!(
                "prompt_name '{}': the model has no prompts (`embedding.prompts` in its \
                 config.yaml, or its {SENTENCE_TRANSFORMERS})",
                crate::clip(name)
            ))),
            None => Err(InferError::invalid(format!(
                "prompt_name '{}' is not one of the model's prompts: {}",
                crate::clip(name),
                prompt_names(&self.config)
            ))),
        }
    }

    /// Where `req`'s inputs are cut, if anywhere: at its `truncate_to`, else at the model's
    /// limit where it asks for truncation (or leaves it to the model's `embedding.truncate`).
    pub fn cut(&self, req: &EmbedRequest) -> Result<Option<Cut>, InferError> {
        let max = self.config.max_input_tokens;
        let side = req.truncation_side;
        match req.truncate_to {
            Some(n) if n > max => Err(InferError::invalid(format!(
                "truncate_prompt_tokens {n} is more than the model takes ({max} tokens)"
            ))),
            Some(n) if n <= self.special_tokens() => Err(InferError::invalid(format!(
                "truncate_prompt_tokens {n} leaves no room for the text: the model adds {} \
                 special tokens to each",
                self.special_tokens()
            ))),
            Some(tokens) => Ok(Some(Cut { side, tokens })),
            None => Ok(req
                .truncate
                .unwrap_or(self.config.truncate)
                .then_some(Cut { side, tokens: max })),
        }
    }

    /// The special tokens the model's tokenizer adds to each text.
    fn special_tokens(&self) -> usize {
        self.exact
            .get_post_processor()
            .map_or(0, |p| p.added_tokens(false))
    }

    /// `text` cut at `cut` (fewer tokens than the model takes), as a tokenizer truncating there
    /// cuts it: the text's own tokens first, then the special tokens added around them.
    fn cut_shorter(&self, text: &str, cut: Cut) -> tokenizers::Result<Vec<u32>> {
        let mut encoding = self.exact.encode(text, false)?;
        let direction = match cut.side {
            TruncationSide::Right => TruncationDirection::Right,
            TruncationSide::Left => TruncationDirection::Left,
        };
        encoding.truncate(
            cut.tokens.saturating_sub(self.special_tokens()),
            0,
            direction,
        );
        Ok(self
            .exact
            .post_process(encoding, None, true)?
            .get_ids()
            .to_vec())
    }

    /// Token ids of each input, checked against the model's limits, each text after
    /// `prompt` (see [`Self::prompt`]; token ids are taken as they are). An input longer than
    /// the model takes is cut where `cut` says ([`Self::cut`]), or refused when it says nowhere.
    pub fn tokenize(
        &self,
        input: &EmbedInput,
        cut: Option<Cut>,
        prompt: Option<&str>,
    ) -> Result<Vec<Vec<u32>>, InferError> {
        let max = self.config.max_input_tokens;
        let too_long = |i: usize, n: usize| {
            InferError::invalid(format!(
                "input {i} has {n} tokens, but the model takes at most {max}; send shorter \
                 text, or ask for truncation (TEI's `truncate: true`)"
            ))
        };
        let ids = match input {
            EmbedInput::Texts(texts) => texts
                .iter()
                .enumerate()
                .map(|(i, text)| {
                    let text = match prompt {
                        Some(prompt) => std::borrow::Cow::Owned(format!("{prompt}{text}")),
                        None => std::borrow::Cow::Borrowed(text.as_str()),
                    };
                    let encode = |t: &Tokenizer| {
                        t.encode(text.as_ref(), true).map_err(|e| {
                            InferError::invalid(format!("input {i} cannot be tokenised: {e}"))
                        })
                    };
                    // Tokenised once, cut where the model's input ends: a text that fits
                    // leaves nothing over and is as the whole, and a longer one is what
                    // truncation gives. Only a refusal counts the whole text's tokens.
                    let fitted = encode(match cut.map(|c| c.side) {
                        Some(TruncationSide::Left) => &self.truncating_left,
                        _ => &self.truncating,
                    })?;
                    match cut {
                        None if !fitted.get_overflowing().is_empty() => {
                            Err(too_long(i, encode(&self.exact)?.len()))
                        }
                        Some(cut) if fitted.len() > cut.tokens => {
                            self.cut_shorter(text.as_ref(), cut).map_err(|e| {
                                InferError::invalid(format!("input {i} cannot be tokenised: {e}"))
                            })
                        }
                        _ => Ok(fitted.get_ids().to_vec()),
                    }
                })
                .collect::<Result<Vec<_>, _>>()?,
            EmbedInput::Tokens(lists) => lists
                .iter()
                .enumerate()
                .map(|(i, ids)| {
                    if let Some(bad) = ids.iter().find(|&&t| t as usize >= self.vocab) {
                        return Err(InferError::invalid(format!(
                            "input {i} holds token id {bad}, past the model's vocabulary of {}",
                            self.vocab
                        )));
                    }
                    let most = cut.map_or(max, |c| c.tokens);
                    match (ids.len() > most, cut.map(|c| c.side)) {
                        (false, _) => Ok(ids.clone()),
                        (true, Some(TruncationSide::Right)) => Ok(ids[..most].to_vec()),
                        (true, Some(TruncationSide::Left)) => Ok(ids[ids.len() - most..].to_vec()),
                        (true, None) => Err(too_long(i, ids.len())),
                    }
                })
                .collect::<Result<Vec<_>, _>>()?,
        };
        if let Some(i) = ids.iter().position(Vec::is_empty) {
            return Err(InferError::invalid(format!("input {i} has no tokens")));
        }
        Ok(ids)
    }

    /// The tokens of `text` as the model reads it (with its special tokens when `special`),
    /// not truncated: each with its id, and, for a token of the text, where it lies in the
    /// text's bytes (TEI's `/tokenize`). With `prompt_name`, the text is read after that
    /// prompt, and the places are in the two together.
    pub fn tokens(
        &self,
        text: &str,
        special: bool,
        prompt_name: Option<&str>,
    ) -> Result<Vec<TextToken>, InferError> {
        let prompted;
        let text = match prompt_name
            .map(|n| self.prompt(Some(n)))
            .transpose()?
            .flatten()
        {
            Some(prompt) => {
                prompted = format!("{prompt}{text}");
                prompted.as_str()
            }
            None => text,
        };
        let encoding = self
            .exact
            .encode(text, special)
            .map_err(|e| InferError::invalid(format!("the text cannot be tokenised: {e}")))?;
        let marks = encoding.get_special_tokens_mask();
        Ok(encoding
            .get_ids()
            .iter()
            .zip(encoding.get_tokens())
            .zip(encoding.get_offsets())
            .enumerate()
            .map(|(i, ((&id, token), &(start, stop)))| {
                let is_special = marks.get(i).is_some_and(|&m| m == 1);
                match text.get(start..stop).filter(|_| !is_special) {
                    Some(piece) => TextToken {
                        id,
                        text: piece.to_string(),
                        special: false,
                        span: Some((start, stop)),
                    },
                    None => TextToken {
                        id,
                        text: token.clone(),
                        special: is_special,
                        span: None,
                    },
                }
            })
            .collect())
    }

    /// The text of token ids, without the special tokens when `skip_special` (TEI's
    /// `/decode`); ids past the vocabulary are refused.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, InferError> {
        if let Some(bad) = ids.iter().find(|&&t| t as usize >= self.vocab) {
            return Err(InferError::invalid(format!(
                "token id {bad} is past the model's vocabulary of {}",
                self.vocab
            )));
        }
        self.exact
            .decode(ids, skip_special)
            .map_err(|e| InferError::invalid(format!("the ids cannot be decoded: {e}")))
    }

    /// The model request for one input's token ids: one item of `ids.len()` tokens, reading
    /// the pooled model's `output` alone.
    fn request(
        &self,
        ids: &[u32],
        signature: &Signature,
        req: &EmbedRequest,
        output: &str,
    ) -> Result<RawRequest, InferError> {
        let inputs = self
            .fills
            .iter()
            .zip(&signature.inputs)
            .map(|(&(fill, dtype), spec)| {
                let value = |t: u32| -> i64 {
                    match fill {
                        Fill::Ids => i64::from(t),
                        Fill::Mask => 1,
                        Fill::Zeros => 0,
                    }
                };
                let data: Vec<u8> = match dtype {
                    DataType::I32 => ids
                        .iter()
                        .flat_map(|&t| (value(t) as i32).to_le_bytes())
                        .collect(),
                    _ => ids.iter().flat_map(|&t| value(t).to_le_bytes()).collect(),
                };
                Ok(NamedTensor {
                    name: spec.name.clone(),
                    tensor: Tensor::new(dtype, vec![1, ids.len()], Bytes::from(data))?,
                })
            })
            .collect::<Result<_, InferError>>()?;
        Ok(RawRequest {
            id: None,
            inputs,
            outputs: Some(vec![output.to_string()]),
            priority: req.priority,
            timeout_us: req.timeout_us,
            ..RawRequest::default()
        })
    }
}

/// What a text encoder is and what it takes, for the protocols that describe a model (TEI's
/// `/info`): built once here from the loaded model, rendered by each protocol.
#[derive(Debug, Clone, PartialEq)]
pub struct EncoderInfo {
    pub name: String,
    pub version: String,
    pub pooling: PoolingConfig,
    /// The vectors' element type.
    pub dtype: DataType,
    /// The full size of the vectors, when the model declares it.
    pub dimension: Option<usize>,
    /// Shorter sizes a request may ask for.
    pub dimensions: Vec<usize>,
    pub normalize: bool,
    /// Whether longer inputs are cut by default.
    pub truncate: bool,
    pub max_input_tokens: usize,
    /// Most texts one batch holds (0: the model does not batch).
    pub max_batch_size: usize,
    /// Most token positions one batch holds, padding included (0: no limit).
    pub max_batch_tokens: usize,
    /// Most items waiting at once; more is refused as overload.
    pub max_queue_size: usize,
    /// Most texts one request may hold.
    pub max_inputs: usize,
}

impl crate::ModelHandle {
    /// What the text encoder is and takes (see [`EncoderInfo`]).
    pub fn encoder_info(&self) -> Result<EncoderInfo, InferError> {
        let encoder = self.text_encoder()?;
        let config = &encoder.config;
        Ok(EncoderInfo {
            name: self.name.clone(),
            version: self.version.clone(),
            pooling: config.pooling,
            dtype: self
                .signature
                .outputs
                .first()
                .map_or(DataType::F32, |o| o.dtype),
            dimension: encoder.dimension,
            dimensions: config.dimensions.clone(),
            normalize: config.normalize,
            truncate: config.truncate,
            max_input_tokens: config.max_input_tokens,
            max_batch_size: self.max_batch_size,
            max_batch_tokens: self
                .config
                .padding
                .as_ref()
                .map_or(0, |p| p.max_batch_tokens),
            max_queue_size: self.config.max_queue_size,
            max_inputs: MAX_INPUTS,
        })
    }

    /// The model's tokenizer and settings, for a text encoder.
    pub fn text_encoder(&self) -> Result<Arc<TextEncoder>, InferError> {
        self.encoder.clone().ok_or_else(|| {
            InferError::invalid(format!(
                "model '{}' is not an embedding model (its config.yaml has no `embedding` section)",
                self.name
            ))
        })
    }

    /// Embeds every input of `req`: tokenises them, queues each as one item, and gathers the
    /// pooled vectors in input order.
    pub async fn embed(&self, req: EmbedRequest) -> Result<Embeddings, InferError> {
        let encoder = self.text_encoder()?;
        let cut = encoder.dimensions(req.dimensions)?;
        let normalize = req.normalize.unwrap_or(encoder.config.normalize);
        let encoded = self
            .encode(&encoder, &req, sheaf_backend::EMBEDDING_OUTPUT, None)
            .await?;
        let vectors = encoded
            .answers
            .iter()
            .map(|answer| {
                let mut vector = floats(answer)?;
                if let Some(d) = cut {
                    vector.truncate(d);
                }
                if normalize {
                    sheaf_backend::normalize(&mut vector);
                }
                Ok(vector)
            })
            .collect::<Result<Vec<_>, InferError>>()?;
        Ok(Embeddings {
            model_name: self.name.clone(),
            model_version: self.version.clone(),
            vectors,
            tokens: encoded.tokens,
            times: encoded.times,
        })
    }

    /// The token states of every input of `req` (TEI's `/embed_all`): tokenised, queued and
    /// batched as [`Self::embed`] does, each input's states as the encoder gave them, one
    /// vector per token, special tokens included, neither pooled, cut nor normalised (the
    /// request's `normalize` and `dimensions` are not read). Inputs whose states would pass
    /// [`MAX_TOKEN_STATES_BYTES`] are refused before they are queued.
    pub async fn embed_tokens(&self, req: EmbedRequest) -> Result<TokenEmbeddings, InferError> {
        let encoder = self.text_encoder()?;
        let most = encoder
            .dimension
            .map(|d| MAX_TOKEN_STATES_BYTES / (d.max(1) * 4));
        let encoded = self
            .encode(&encoder, &req, sheaf_backend::TOKEN_STATES_OUTPUT, most)
            .await?;
        let states = encoded
            .answers
            .iter()
            .zip(&encoded.lengths)
            .map(|(answer, &tokens)| {
                let values = floats(answer)?;
                if tokens == 0 || values.len() % tokens != 0 {
                    return Err(InferError::internal(format!(
                        "the encoder returned {} values for {tokens} tokens",
                        values.len()
                    )));
                }
                Ok(values
                    .chunks_exact(values.len() / tokens)
                    .map(<[f32]>::to_vec)
                    .collect())
            })
            .collect::<Result<Vec<_>, InferError>>()?;
        Ok(TokenEmbeddings {
            model_name: self.name.clone(),
            model_version: self.version.clone(),
            states,
            tokens: encoded.tokens,
            times: encoded.times,
        })
    }

    /// Tokenises every input of `req`, queues each as one item reading the pooled model's
    /// `output`, and gathers the answers in input order; inputs of more than `most_tokens`
    /// tokens in all are refused before they are queued.
    async fn encode(
        &self,
        encoder: &Arc<TextEncoder>,
        req: &EmbedRequest,
        output: &str,
        most_tokens: Option<usize>,
    ) -> Result<Encoded, InferError> {
        if req.input.is_empty() {
            return Err(InferError::invalid("`input` holds no text to embed"));
        }
        if req.input.len() > MAX_INPUTS {
            return Err(InferError::invalid(format!(
                "`input` holds {} texts; at most {MAX_INPUTS} fit one request",
                req.input.len()
            )));
        }
        let cut = encoder.cut(req)?;
        let prompt = match &req.input {
            EmbedInput::Texts(_) => encoder.prompt(req.prompt_name.as_deref())?,
            EmbedInput::Tokens(_) if req.prompt_name.is_some() => {
                return Err(InferError::invalid(
                    "prompt_name applies to texts; token ids are embedded as they are",
                ))
            }
            EmbedInput::Tokens(_) => None,
        };
        let prompt = prompt.map(str::to_string);
        let bytes = match &req.input {
            EmbedInput::Texts(t) => t.iter().map(String::len).sum(),
            EmbedInput::Tokens(_) => 0,
        };
        let tokenizing = std::time::Instant::now();
        let ids = if bytes <= INLINE_TOKENIZE_BYTES {
            encoder.tokenize(&req.input, cut, prompt.as_deref())?
        } else {
            let (encoder, input) = (encoder.clone(), req.input.clone());
            tokio::task::spawn_blocking(move || encoder.tokenize(&input, cut, prompt.as_deref()))
                .await
                .map_err(|e| InferError::internal(format!("tokenising failed: {e}")))??
        };
        let tokenization = tokenizing.elapsed();
        let lengths: Vec<usize> = ids.iter().map(Vec::len).collect();
        let tokens: usize = lengths.iter().sum();
        if let Some(most) = most_tokens.filter(|&m| tokens > m) {
            return Err(InferError::invalid(format!(
                "the inputs hold {tokens} tokens, and the states of at most {most} fit one \
                 answer ({} MiB of FP32); send fewer or shorter texts",
                MAX_TOKEN_STATES_BYTES >> 20
            )));
        }
        let requests = ids
            .iter()
            .map(|ids| encoder.request(ids, &self.signature, req, output))
            .collect::<Result<Vec<_>, _>>()?;
        let answers =
            futures::future::try_join_all(requests.into_iter().map(|r| self.infer(r))).await?;
        let receipts = answers.iter().filter_map(|a| a.receipt.as_ref());
        let times = EmbedTimes {
            tokenization,
            queue: receipts
                .clone()
                .map(|r| r.queued())
                .max()
                .unwrap_or_default(),
            inference: receipts.map(|r| r.phases().infer).max().unwrap_or_default(),
        };
        Ok(Encoded {
            tokens,
            lengths,
            answers,
            times,
        })
    }
}

/// The answers of an encoder to each input of a request, as `ModelHandle::encode` gathers them.
struct Encoded {
    answers: Vec<crate::request::InferResponse>,
    /// Each input's tokens.
    lengths: Vec<usize>,
    tokens: usize,
    times: EmbedTimes,
}

/// The FP32 values of an encoder's one answer.
fn floats(answer: &crate::request::InferResponse) -> Result<Vec<f32>, InferError> {
    let tensor = answer
        .outputs
        .first()
        .map(|o| &o.tensor)
        .filter(|t| t.dtype() == DataType::F32)
        .ok_or_else(|| InferError::internal("the encoder returned no FP32 output"))?;
    Ok(tensor
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tei_s_truncation_directions_are_read_in_any_case_and_others_refused() {
        for (name, side) in [
            ("Right", Some(TruncationSide::Right)),
            ("right", Some(TruncationSide::Right)),
            ("Left", Some(TruncationSide::Left)),
            ("LEFT", Some(TruncationSide::Left)),
            ("middle", None),
            ("", None),
        ] {
            assert_eq!(TruncationSide::parse(name), side, "{name}");
        }
        assert_eq!(TruncationSide::default(), TruncationSide::Right);
    }

    #[test]
    fn the_first_vector_is_compared_with_each_other_by_cosine() {
        let answer = Embeddings {
            model_name: "m".into(),
            model_version: "1".into(),
            vectors: vec![
                vec![1.0, 0.0],
                vec![3.0, 0.0],
                vec![0.0, 2.0],
                vec![-1.0, 1.0],
                vec![0.0, 0.0],
            ],
            tokens: 0,
            times: EmbedTimes::default(),
        };
        let scores = answer.scores(1);
        assert_eq!(scores.len(), 4);
        assert!((scores[0] - 1.0).abs() < 1e-6, "{scores:?}");
        assert!(scores[1].abs() < 1e-6, "{scores:?}");
        assert!(
            (scores[2] + std::f32::consts::FRAC_1_SQRT_2).abs() < 1e-6,
            "{scores:?}"
        );
        assert_eq!(scores[3], 0.0, "a vector without length is like none");
    }

    #[test]
    fn one_text_against_others_is_refused_by_field_where_nothing_can_be_scored() {
        let names = ("query", "texts");
        let against = |one: &str, others: &[&str]| {
            one_against_others(
                one.into(),
                others.iter().map(|t| t.to_string()),
                names,
                "rank",
            )
        };
        assert_eq!(against("q", &["a", "b"]).unwrap(), ["q", "a", "b"]);
        let refused = |one: &str, others: &[&str]| against(one, others).unwrap_err().message;
        assert_eq!(
            refused("", &["a"]),
            "`query` is an empty string: there is nothing to rank"
        );
        assert_eq!(
            refused("q", &[]),
            "`texts` is an empty list: there is nothing to rank"
        );
        assert_eq!(
            refused("q", &["a", ""]),
            "`texts`[1] is an empty string: there is nothing to rank"
        );
    }

    #[test]
    fn several_queries_are_scored_in_pairs() {
        let answer = Embeddings {
            model_name: "m".into(),
            model_version: "1".into(),
            vectors: vec![
                vec![1.0, 0.0],
                vec![0.0, 1.0],
                vec![2.0, 0.0],
                vec![0.0, -1.0],
            ],
            tokens: 0,
            times: EmbedTimes::default(),
        };
        // Query 0 with vector 2, query 1 with vector 3.
        assert_eq!(answer.scores(2), vec![1.0, -1.0]);
        // One query against the three others.
        assert_eq!(answer.scores(1), vec![0.0, 1.0, 0.0]);
        assert!(answer.scores(4).is_empty(), "no pairs");
    }

    #[test]
    fn ranking_puts_the_highest_first_and_keeps_ties_in_order() {
        let scores = [0.2, 0.9, 0.2, -0.5, 0.9];
        assert_eq!(
            ranked(&scores, 0),
            vec![(1, 0.9), (4, 0.9), (0, 0.2), (2, 0.2), (3, -0.5)]
        );
        assert_eq!(ranked(&scores, 2), vec![(1, 0.9), (4, 0.9)]);
        assert_eq!(ranked(&scores, 9).len(), 5);
    }
}
