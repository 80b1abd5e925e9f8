//! The HTTP client that the subcommands talking to a server (`bench`, `models`) share.

/// The HTTP client of `sheaf bench` and `sheaf models`: it sends [`headers`] on every request.
pub fn http_client(key: Option<&str>, extra: &[String]) -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .default_headers(headers(key, extra)?)
        .build()?)
}

/// What a client sends with every request (as HTTP headers, or gRPC metadata): `key`, if any,
/// as `Authorization: Bearer KEY`, and each of `extra` (`NAME:VALUE`, the header a restricted
/// API group needs: `admin-key:SECRET`; over gRPC, `triton-grpc-protocol-admin-key:SECRET`).
pub fn headers(key: Option<&str>, extra: &[String]) -> anyhow::Result<reqwest::header::HeaderMap> {
    let mut headers = reqwest::header::HeaderMap::new();
    for given in extra {
        let bad = || anyhow::anyhow!("--header '{given}': give NAME:VALUE, e.g. admin-key:SECRET");
        let (name, value) = given.split_once(':').ok_or_else(bad)?;
        let name =
            reqwest::header::HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| bad())?;
        let mut value = reqwest::header::HeaderValue::from_str(value.trim()).map_err(|_| bad())?;
        value.set_sensitive(true);
        headers.insert(name, value);
    }
    if let Some(key) = key {
        let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {key}"))
            .map_err(|_| anyhow::anyhow!("the key must be printable ASCII"))?;
        value.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, value);
    }
    Ok(headers)
}
