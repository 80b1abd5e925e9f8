//! Cross-origin requests from web pages (CORS), for the origins the server is started with
//! (`--cors-allow-origin`). Without any, a browser page on another site can read nothing the
//! main HTTP port answers, and its POSTs are refused ([`super::gate`]). With them, a page served
//! from one of those origins may call every route of the main port: its preflight (`OPTIONS`)
//! is answered here, before the key checks (a browser sends no credentials with it), and every
//! answer to it, errors included, says that it may read it. Its requests still need the key
//! their route needs. The SageMaker, Vertex AI and metrics ports do not take part.

use std::time::Duration;

use axum::http::{header, HeaderName, HeaderValue, Method};
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};

/// How long a browser may keep a preflight's answer before it asks again.
const PREFLIGHT_MAX_AGE: Duration = Duration::from_secs(3600);

/// The answer headers a page's script may read besides the always readable ones: the length of
/// the JSON part of a binary-tensor answer, and how long to wait after a 503 or 429.
const EXPOSED: [HeaderName; 2] = [
    HeaderName::from_static("inference-header-content-length"),
    header::RETRY_AFTER,
];

/// The origins whose pages may call the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cors {
    /// Any origin (`*`).
    Any,
    /// These origins, each `scheme://host[:port]`, compared as browsers send them.
    Origins(Vec<HeaderValue>),
}

impl Cors {
    /// The origins given on the command line; none: no cross-origin access. `*` allows any
    /// origin and stands alone. Each other value must be an origin as a browser sends it
    /// (`https://app.example.com`, `http://localhost:3000`): a scheme, a host, a port at most,
    /// and no path.
    pub fn parse(values: &[String]) -> Result<Option<Cors>, String> {
        let values: Vec<&str> = values
            .iter()
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
            .collect();
        if values.is_empty() {
            return Ok(None);
        }
        if values.contains(&"*") {
            if values.len() > 1 {
                return Err(
                    "--cors-allow-origin: `*` allows every origin and cannot be listed with others"
                        .into(),
                );
            }
            return Ok(Some(Cors::Any));
        }
        let mut origins = Vec::with_capacity(values.len());
        for value in values {
            origins.push(origin(value)?);
        }
        Ok(Some(Cors::Origins(origins)))
    }

    /// Whether a page from `origin` (a request's `Origin` header) may call the server.
    pub fn allows(&self, origin: &HeaderValue) -> bool {
        match self {
            Cors::Any => true,
            Cors::Origins(origins) => origins
                .iter()
                .any(|o| o.as_bytes().eq_ignore_ascii_case(origin.as_bytes())),
        }
    }

    /// The layer that answers preflights and marks answers readable by the allowed origins.
    pub fn layer(&self) -> CorsLayer {
        let origins = match self {
            Cors::Any => AllowOrigin::any(),
            Cors::Origins(_) => {
                let cors = self.clone();
                AllowOrigin::predicate(move |origin, _| cors.allows(origin))
            }
        };
        CorsLayer::new()
            .allow_origin(origins)
            .allow_methods([Method::GET, Method::HEAD, Method::POST, Method::DELETE])
            // Whatever the page asks to send (`Authorization`, `Content-Type`, tritonclient's
            // `Inference-Header-Content-Length`, forwarded headers): the routes check them.
            .allow_headers(AllowHeaders::mirror_request())
            .expose_headers(EXPOSED)
            .max_age(PREFLIGHT_MAX_AGE)
    }
}

/// `value` checked as an origin: `http` or `https`, a host, an optional port, nothing after.
fn origin(value: &str) -> Result<HeaderValue, String> {
    let bad = |why: &str| {
        Err(format!(
            "--cors-allow-origin {value:?}: {why}; an origin is a scheme and a host, with a port \
             at most, as in https://app.example.com or http://localhost:3000"
        ))
    };
    let Some((scheme, rest)) = value.split_once("://") else {
        return bad("it has no scheme");
    };
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return bad("its scheme is not http or https");
    }
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() {
        return bad("it has no host");
    }
    if rest.contains(['/', '?', '#', '@']) || rest.chars().any(char::is_whitespace) {
        return bad("it has more than a host and a port");
    }
    if let Some((_, port)) = rest
        .rsplit_once(':')
        .filter(|(host, _)| !host.ends_with(']'))
    {
        if port.parse::<u16>().is_err() {
            return bad("its port is not a number up to 65535");
        }
    }
    HeaderValue::from_str(&format!("{scheme}://{rest}")).or_else(|_| bad("it is not ASCII text"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(values: &[&str]) -> Result<Option<Cors>, String> {
        Cors::parse(&values.iter().map(|v| v.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn origins_are_read_as_browsers_send_them() {
        assert_eq!(parse(&[]), Ok(None));
        assert_eq!(parse(&[" "]), Ok(None));
        assert_eq!(parse(&["*"]), Ok(Some(Cors::Any)));
        let cors = parse(&["https://app.example.com/", "http://localhost:3000"])
            .unwrap()
            .unwrap();
        let allows = |o: &'static str| cors.allows(&HeaderValue::from_static(o));
        assert!(allows("https://app.example.com"));
        assert!(allows("HTTPS://APP.example.com"));
        assert!(allows("http://localhost:3000"));
        assert!(!allows("http://localhost:3001"));
        assert!(!allows("http://app.example.com"));
        assert!(!allows("null"));
        assert!(Cors::Any.allows(&HeaderValue::from_static("null")));
        assert!(parse(&["http://[::1]:8080"]).unwrap().is_some());
    }

    #[test]
    fn what_is_not_an_origin_is_named() {
        for (value, why) in [
            ("app.example.com", "no scheme"),
            ("ftp://app.example.com", "not http or https"),
            ("https://", "no host"),
            ("https://app.example.com/page", "more than a host"),
            ("https://user@app.example.com", "more than a host"),
            ("http://localhost:99999", "port"),
        ] {
            let error = parse(&[value]).unwrap_err();
            assert!(
                error.contains(why) && error.contains(value),
                "{value}: {error}"
            );
        }
        let error = parse(&["*", "https://a.example"]).unwrap_err();
        assert!(error.contains("cannot be listed with others"), "{error}");
    }
}
