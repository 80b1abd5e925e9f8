//! JSON bodies of the KServe v2 inference endpoints.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// `POST /v2/models/{m}/infer` body (the JSON part, with the binary extension).
#[derive(Debug, Deserialize)]
pub struct InferRequestBody {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub parameters: Option<Map<String, Value>>,
    pub inputs: Vec<InputTensor>,
    #[serde(default)]
    pub outputs: Option<Vec<RequestedOutput>>,
}

/// One input tensor. `data` stays raw until the datatype is known.
#[derive(Debug, Deserialize)]
pub struct InputTensor {
    pub name: String,
    pub shape: Vec<i64>,
    pub datatype: String,
    #[serde(default)]
    pub parameters: Option<Map<String, Value>>,
    #[serde(default)]
    pub data: Option<Box<RawValue>>,
}

/// One requested output.
#[derive(Debug, Deserialize)]
pub struct RequestedOutput {
    pub name: String,
    #[serde(default)]
    pub parameters: Option<Map<String, Value>>,
}

/// The JSON part of an inference response.
#[derive(Debug, Serialize)]
pub struct InferResponseBody<'a> {
    pub model_name: &'a str,
    pub model_version: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<&'a str>,
    /// What the model put in its answer (a Python model's `InferenceResponse(parameters=...)`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameters: Option<&'a Map<String, Value>>,
    pub outputs: Vec<OutputTensor<'a>>,
}

/// One output tensor: inline `data`, or `parameters.binary_data_size` with the bytes appended.
#[derive(Debug, Serialize)]
pub struct OutputTensor<'a> {
    pub name: &'a str,
    pub datatype: &'a str,
    pub shape: &'a [usize],
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<OutputData<'a>>,
}

/// An output's inline data: numbers of its datatype, or the strings of a BYTES output.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum OutputData<'a> {
    Numbers(super::json_data::DataView<'a>),
    Strings(Vec<&'a str>),
}
