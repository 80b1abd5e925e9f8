//! Triton's JSON form of a configuration read as text-format fields ([`from_json`]), as
//! protobuf's JSON reader takes it.

use super::text::Value;

/// Fields whose JSON form is an object of entries (protobuf maps), written in text format as
/// `name { key: "k" value ... }` entries.
const MAP_FIELDS: &[&str] = &["parameters", "input_map", "output_map", "inputs"];

/// Triton's JSON form of a configuration as text-format fields, as protobuf's JSON reader
/// takes it: field names in `snake_case` or `lowerCamelCase`, maps as objects, enums as their
/// names, 64-bit integers as numbers or strings; a `null` field is left out.
pub fn from_json(json: &serde_json::Value) -> Result<Vec<(String, Value)>, String> {
    match json {
        serde_json::Value::Object(map) => json_fields(map, ""),
        _ => Err("the configuration is not a JSON object".into()),
    }
}

fn json_fields(
    map: &serde_json::Map<String, serde_json::Value>,
    path: &str,
) -> Result<Vec<(String, Value)>, String> {
    let mut fields = Vec::with_capacity(map.len());
    for (key, value) in map {
        if value.is_null() {
            continue;
        }
        let name = snake_case(key);
        let at = match path {
            "" => name.clone(),
            _ => format!("{path}.{name}"),
        };
        let value = match (MAP_FIELDS.contains(&name.as_str()), value) {
            (true, serde_json::Value::Object(entries)) => Value::List(
                entries
                    .iter()
                    .map(|(k, v)| {
                        let entry = vec![
                            ("key".to_string(), Value::Text(k.clone())),
                            ("value".to_string(), json_value(v, &format!("{at}.{k}"))?),
                        ];
                        Ok(Value::Message(entry))
                    })
                    .collect::<Result<_, String>>()?,
            ),
            (true, _) => return Err(format!("{at}: expected an object of entries")),
            (false, v) => json_value(v, &at)?,
        };
        fields.push((name, value));
    }
    Ok(fields)
}

fn json_value(value: &serde_json::Value, at: &str) -> Result<Value, String> {
    use serde_json::Value as J;
    Ok(match value {
        J::Null => return Err(format!("{at}: null is not a value")),
        J::Bool(b) => Value::Word(b.to_string()),
        J::Number(n) => Value::Word(n.to_string()),
        // protobuf's JSON writes 64-bit integers as strings.
        J::String(s) if s.parse::<i64>().is_ok() => Value::Word(s.clone()),
        J::String(s) => Value::Text(s.clone()),
        J::Array(items) => Value::List(
            items
                .iter()
                .map(|v| json_value(v, at))
                .collect::<Result<_, _>>()?,
        ),
        J::Object(map) => Value::Message(json_fields(map, at)?),
    })
}

/// `maxBatchSize` as `max_batch_size`; a `snake_case` name stays as it is.
fn snake_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for c in name.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}
