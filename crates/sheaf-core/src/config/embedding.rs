//! The `embedding` section: a text encoder served on the embeddings routes, with its tokenizer
//! and pooling.

use std::collections::BTreeMap;

use serde::Deserialize;

/// The `embedding` section: how text becomes the encoder's inputs, and its token states one
/// vector.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EmbeddingConfig {
    /// The Hugging Face `tokenizer.json`, relative to the version folder, or else the model
    /// folder. Its own padding and truncation settings are ignored.
    pub tokenizer: String,
    /// `mean` (over the tokens the mask keeps), `cls` (the first token) or `last`.
    pub pooling: PoolingConfig,
    /// Scale vectors to unit length unless a request says otherwise (TEI's `normalize`).
    pub normalize: bool,
    /// Most tokens of one input, special tokens included (the encoder's position limit).
    pub max_input_tokens: usize,
    /// Cut longer inputs to `max_input_tokens` unless a request says otherwise (TEI's
    /// `truncate`). Off: a longer input is refused, naming its length.
    pub truncate: bool,
    /// Shorter sizes a request may ask for with `dimensions` (Matryoshka-trained models): the
    /// vector is cut to that size, then normalised again. Empty: only the full size.
    pub dimensions: Vec<usize>,
    /// The encoder input that holds the attention mask.
    pub mask_input: String,
    /// The encoder output that holds the token states. Absent: its first output of rank 3.
    pub hidden_output: Option<String>,
    /// Texts put before an input, by name (sentence-transformers' `prompts`, e.g. `{query:
    /// "query: ", passage: "passage: "}`): a request names one with `prompt_name` (TEI's).
    /// Empty: those of the model folder's `config_sentence_transformers.json`, if it has one.
    pub prompts: BTreeMap<String, String>,
    /// The prompt put before the texts of a request that names none (sentence-transformers'
    /// `default_prompt_name`). Absent: that of `config_sentence_transformers.json`, else none.
    pub default_prompt_name: Option<String>,
}

impl Default for EmbeddingConfig {
    fn default() -> Self {
        EmbeddingConfig {
            tokenizer: "tokenizer.json".into(),
            pooling: PoolingConfig::Mean,
            normalize: true,
            max_input_tokens: 512,
            truncate: false,
            dimensions: Vec::new(),
            mask_input: "attention_mask".into(),
            hidden_output: None,
            prompts: BTreeMap::new(),
            default_prompt_name: None,
        }
    }
}

impl EmbeddingConfig {
    /// How instances pool, as backends take it.
    pub fn pool_spec(&self) -> sheaf_backend::PoolSpec {
        sheaf_backend::PoolSpec {
            pooling: match self.pooling {
                PoolingConfig::Mean => sheaf_backend::Pooling::Mean,
                PoolingConfig::Cls => sheaf_backend::Pooling::Cls,
                PoolingConfig::Last => sheaf_backend::Pooling::Last,
            },
            // Normalisation is per request (TEI's `normalize`), after pooling.
            normalize: false,
            mask_input: self.mask_input.clone(),
            hidden_output: self.hidden_output.clone(),
        }
    }
}

/// `embedding.pooling` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum PoolingConfig {
    #[default]
    Mean,
    Cls,
    Last,
}
