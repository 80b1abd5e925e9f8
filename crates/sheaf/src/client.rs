//! The HTTP client that the subcommands talking to a server (`bench`, `models`) share.

/// The HTTP client of `sheaf bench` and `sheaf models`: it sends `key`, if any, as
/// `Authorization: Bearer KEY` on every request.
pub fn http_client(key: Option<&str>) -> anyhow::Result<reqwest::Client> {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(key) = key {
        let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {key}"))
            .map_err(|_| anyhow::anyhow!("the key must be printable ASCII"))?;
        value.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, value);
    }
    Ok(reqwest::Client::builder()
        .default_headers(headers)
        .build()?)
}
