//! CORS for the REST broadcast routes. realtime-js's `httpSend` posts with `apikey`,
//! `Authorization` and a JSON content type, so a browser on another origin always sends a
//! preflight `OPTIONS` first and then reads the answer only if it names the page's origin.
//! Supabase adds `Access-Control-Allow-Origin: *` to both routes and its gateway answers the
//! preflight; the sidecar does both itself, for the origins `CORS_ALLOWED_ORIGINS` allows.

use hyper::header::{
    HeaderMap, HeaderValue, ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS,
    ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_MAX_AGE, ACCESS_CONTROL_REQUEST_HEADERS, ORIGIN,
    VARY,
};

/// `CORS_ALLOWED_ORIGINS`: `*` (any origin, as Supabase), or a comma-separated list of
/// origins (`scheme://host[:port]`), compared exactly as browsers send them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AllowedOrigins {
    Any,
    Only(Vec<String>),
}

/// What a preflight may ask for when realtime-js (or `fetch` with its headers) posts.
const METHODS: &str = "POST, OPTIONS";
/// The headers allowed when the preflight does not list the ones it wants.
const DEFAULT_HEADERS: &str = "apikey, authorization, content-type, x-client-info";
/// How long a browser may keep a preflight's answer (seconds).
const MAX_AGE: &str = "86400";

impl AllowedOrigins {
    /// Parses the setting; the error says what is wrong with which entry.
    pub fn parse(s: &str) -> Result<AllowedOrigins, String> {
        let s = s.trim();
        if s == "*" {
            return Ok(AllowedOrigins::Any);
        }
        let mut origins = Vec::new();
        // Schemes and hosts are case-insensitive, and browsers send them in lower case.
        for entry in s.split(',').map(|e| e.trim().to_ascii_lowercase()) {
            let Some((scheme, host)) = entry.split_once("://") else {
                return Err(format!(
                    "{entry:?} is not an origin: write * or scheme://host[:port], comma-separated"
                ));
            };
            let valid_host = !host.is_empty()
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-.:[]".contains(&b));
            if !matches!(scheme, "http" | "https") || !valid_host {
                return Err(format!(
                    "{entry:?} is not an origin: write http(s)://host[:port] without a path"
                ));
            }
            origins.push(entry);
        }
        Ok(AllowedOrigins::Only(origins))
    }

    /// The `Access-Control-Allow-Origin` value for a request from `origin`, or None when it
    /// is not allowed (the browser then keeps the answer from the page).
    fn allow(&self, origin: Option<&HeaderValue>) -> Option<HeaderValue> {
        match self {
            AllowedOrigins::Any => Some(HeaderValue::from_static("*")),
            AllowedOrigins::Only(list) => {
                let origin = origin?;
                let text = origin.to_str().ok()?.to_ascii_lowercase();
                list.contains(&text).then(|| origin.clone())
            }
        }
    }

    /// Adds the CORS headers to a REST broadcast response for a request from `origin` (its
    /// `Origin` header). A list of origins makes the answer depend on `Origin`, so caches
    /// are told.
    pub fn decorate(&self, origin: Option<&HeaderValue>, response: &mut HeaderMap) {
        if let AllowedOrigins::Only(_) = self {
            response.append(VARY, HeaderValue::from_static("Origin"));
        }
        if let Some(allow) = self.allow(origin) {
            response.insert(ACCESS_CONTROL_ALLOW_ORIGIN, allow);
        }
    }

    /// The answer to a preflight: whether the origin may post, and the headers that say so
    /// (none but `Vary` for an origin that may not).
    pub fn preflight(&self, request: &HeaderMap, response: &mut HeaderMap) -> bool {
        self.decorate(request.get(ORIGIN), response);
        if !response.contains_key(ACCESS_CONTROL_ALLOW_ORIGIN) {
            return false;
        }
        // Authorization is by token, not by the headers' names: whatever the page asks to
        // send is allowed (the request's size is bounded like any other).
        let headers = request
            .get(ACCESS_CONTROL_REQUEST_HEADERS)
            .cloned()
            .unwrap_or_else(|| HeaderValue::from_static(DEFAULT_HEADERS));
        response.insert(ACCESS_CONTROL_ALLOW_HEADERS, headers);
        response.insert(
            ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static(METHODS),
        );
        response.insert(ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static(MAX_AGE));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
        h.get(name).map(|v| v.to_str().unwrap())
    }

    #[test]
    fn the_setting_is_a_star_or_a_list_of_origins() {
        assert_eq!(AllowedOrigins::parse("*"), Ok(AllowedOrigins::Any));
        assert_eq!(
            AllowedOrigins::parse("https://app.example.com, http://127.0.0.1:3000"),
            Ok(AllowedOrigins::Only(vec![
                "https://app.example.com".into(),
                "http://127.0.0.1:3000".into()
            ]))
        );
        for bad in [
            "",
            "app.example.com",
            "https://app.example.com/path",
            "ftp://x",
            "https://",
            "*,https://a.b",
        ] {
            assert!(AllowedOrigins::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn any_origin_gets_a_star_as_supabase_answers() {
        let any = AllowedOrigins::Any;
        let mut out = HeaderMap::new();
        any.decorate(
            request(&[("origin", "http://x.test")]).get(ORIGIN),
            &mut out,
        );
        assert_eq!(header(&out, "access-control-allow-origin"), Some("*"));
        assert_eq!(header(&out, "vary"), None);
        // A client that is no browser sends no Origin; the header does no harm.
        let mut out = HeaderMap::new();
        any.decorate(None, &mut out);
        assert_eq!(header(&out, "access-control-allow-origin"), Some("*"));
    }

    #[test]
    fn a_listed_origin_is_named_back_and_an_unlisted_one_gets_no_allow_header() {
        let only = AllowedOrigins::parse("http://127.0.0.1:3000").unwrap();
        let mut out = HeaderMap::new();
        let req = request(&[("origin", "http://127.0.0.1:3000")]);
        only.decorate(req.get(ORIGIN), &mut out);
        assert_eq!(
            header(&out, "access-control-allow-origin"),
            Some("http://127.0.0.1:3000")
        );
        assert_eq!(header(&out, "vary"), Some("Origin"));
        for origin in ["http://127.0.0.1:3001", "https://127.0.0.1:3000", "null"] {
            let mut out = HeaderMap::new();
            let req = request(&[("origin", origin)]);
            only.decorate(req.get(ORIGIN), &mut out);
            assert_eq!(
                header(&out, "access-control-allow-origin"),
                None,
                "{origin}"
            );
            assert_eq!(header(&out, "vary"), Some("Origin"), "{origin}");
        }
        // Browsers send origins in lower case; a setting written in capitals still matches.
        let caps = AllowedOrigins::parse("HTTP://App.Example.com").unwrap();
        let mut out = HeaderMap::new();
        let req = request(&[("origin", "http://app.example.com")]);
        caps.decorate(req.get(ORIGIN), &mut out);
        assert_eq!(
            header(&out, "access-control-allow-origin"),
            Some("http://app.example.com")
        );
    }

    #[test]
    fn a_preflight_allows_what_the_page_asks_for_only_from_an_allowed_origin() {
        let only = AllowedOrigins::parse("http://a.test").unwrap();
        let asks = [
            ("origin", "http://a.test"),
            ("access-control-request-method", "POST"),
            (
                "access-control-request-headers",
                "apikey,authorization,content-type",
            ),
        ];
        let mut out = HeaderMap::new();
        assert!(only.preflight(&request(&asks), &mut out));
        assert_eq!(
            header(&out, "access-control-allow-origin"),
            Some("http://a.test")
        );
        assert_eq!(
            header(&out, "access-control-allow-headers"),
            Some("apikey,authorization,content-type")
        );
        assert_eq!(
            header(&out, "access-control-allow-methods"),
            Some("POST, OPTIONS")
        );
        assert_eq!(header(&out, "access-control-max-age"), Some("86400"));

        let mut out = HeaderMap::new();
        let stranger = [("origin", "http://b.test"), asks[1], asks[2]];
        assert!(!only.preflight(&request(&stranger), &mut out));
        for name in [
            "access-control-allow-origin",
            "access-control-allow-headers",
            "access-control-allow-methods",
        ] {
            assert_eq!(header(&out, name), None, "{name}");
        }

        // Without the list of headers, the ones realtime-js sends are allowed.
        let mut out = HeaderMap::new();
        assert!(AllowedOrigins::Any.preflight(&request(&[("origin", "http://c.test")]), &mut out));
        assert_eq!(
            header(&out, "access-control-allow-headers"),
            Some(DEFAULT_HEADERS)
        );
    }
}
