//! A small RESP codec for the Sentinel endpoint (sentinel.rs): requests
//! are parsed from a byte buffer (multibulk arrays of bulk strings, as
//! every client sends, or inline commands, as typed into a terminal) with
//! hard limits, and replies are encoded in RESP2 or RESP3 (after `HELLO 3`,
//! which redis-py 8 sends on connect).  Malformed input is a typed error
//! (the connection then gets `-ERR Protocol error: ...` and is closed, as
//! Redis does); nothing here panics on input.

use std::fmt;

/// At most this many arguments in one request.
pub const MAX_ARGS: usize = 1024;
/// At most this long, one argument (bulk string) or one inline line.
pub const MAX_BULK: usize = 64 * 1024;

/// Why a request could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RespError {
    /// A length or count that is not a decimal number.
    BadLength(String),
    /// More arguments than MAX_ARGS, or a negative count.
    BadCount(i64),
    /// A bulk string or inline line longer than MAX_BULK.
    TooLong(usize),
    /// Inside a multibulk array, something other than `$`.
    ExpectedBulk(u8),
    /// A bulk string not followed by CRLF.
    MissingCrlf,
    /// An inline command with an unbalanced quote.
    UnbalancedQuotes,
}

impl RespError {
    pub fn code(&self) -> &'static str {
        match self {
            RespError::BadLength(_) => "bad_length",
            RespError::BadCount(_) => "bad_count",
            RespError::TooLong(_) => "too_long",
            RespError::ExpectedBulk(_) => "expected_bulk",
            RespError::MissingCrlf => "missing_crlf",
            RespError::UnbalancedQuotes => "unbalanced_quotes",
        }
    }
}

impl fmt::Display for RespError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RespError::BadLength(s) => write!(f, "invalid bulk length {s:?}"),
            RespError::BadCount(n) => write!(f, "invalid multibulk length {n}"),
            RespError::TooLong(n) => write!(f, "argument of {n} bytes (limit {MAX_BULK})"),
            RespError::ExpectedBulk(b) => write!(f, "expected '$', got {:?}", *b as char),
            RespError::MissingCrlf => write!(f, "bulk string not followed by CRLF"),
            RespError::UnbalancedQuotes => write!(f, "unbalanced quotes in request"),
        }
    }
}

impl std::error::Error for RespError {}

/// A whole request (its arguments and the bytes it used), or None: more
/// bytes are needed.
pub type Parsed = Result<Option<(Vec<Vec<u8>>, usize)>, RespError>;

/// The line that starts at `at`, without its CRLF (a bare LF is accepted
/// for inline commands); None if no line end is buffered yet.
fn line(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let rest = buf.get(at..)?;
    let nl = rest.iter().position(|&b| b == b'\n')?;
    let body = &rest[..nl];
    let body = body.strip_suffix(b"\r").unwrap_or(body);
    Some((body, at + nl + 1))
}

fn number(s: &[u8]) -> Result<i64, RespError> {
    std::str::from_utf8(s)
        .ok()
        .and_then(|t| t.parse::<i64>().ok())
        .ok_or_else(|| RespError::BadLength(String::from_utf8_lossy(s).into_owned()))
}

/// Parses one request from the front of `buf`: Ok(Some((args, used))) when
/// a whole one is there, Ok(None) when more bytes are needed.  An empty
/// request (a blank inline line, `*0`) gives an empty `args`.
pub fn parse_request(buf: &[u8]) -> Parsed {
    match buf.first() {
        None => Ok(None),
        Some(b'*') => parse_multibulk(buf),
        Some(_) => parse_inline(buf),
    }
}

fn parse_multibulk(buf: &[u8]) -> Parsed {
    let Some((head, mut at)) = line(buf, 0) else {
        return if buf.len() > MAX_BULK {
            Err(RespError::TooLong(buf.len()))
        } else {
            Ok(None)
        };
    };
    let n = number(&head[1..])?;
    if n <= 0 {
        // *0 and *-1 are empty requests, which Redis ignores
        return if n < -1 {
            Err(RespError::BadCount(n))
        } else {
            Ok(Some((Vec::new(), at)))
        };
    }
    if n as u64 > MAX_ARGS as u64 {
        return Err(RespError::BadCount(n));
    }
    let mut args = Vec::with_capacity(n as usize);
    for _ in 0..n {
        match buf.get(at) {
            None => return Ok(None),
            Some(b'$') => {}
            Some(&b) => return Err(RespError::ExpectedBulk(b)),
        }
        let Some((lenline, next)) = line(buf, at) else {
            return if buf.len() - at > 32 {
                Err(RespError::BadLength(
                    String::from_utf8_lossy(&buf[at + 1..at + 32]).into_owned(),
                ))
            } else {
                Ok(None)
            };
        };
        let len = number(&lenline[1..])?;
        if len < 0 {
            return Err(RespError::BadLength(len.to_string()));
        }
        let len = len as usize;
        if len > MAX_BULK {
            return Err(RespError::TooLong(len));
        }
        let end = next + len;
        if buf.len() < end + 2 {
            return Ok(None);
        }
        if &buf[end..end + 2] != b"\r\n" {
            return Err(RespError::MissingCrlf);
        }
        args.push(buf[next..end].to_vec());
        at = end + 2;
    }
    Ok(Some((args, at)))
}

fn parse_inline(buf: &[u8]) -> Parsed {
    let Some((body, used)) = line(buf, 0) else {
        return if buf.len() > MAX_BULK {
            Err(RespError::TooLong(buf.len()))
        } else {
            Ok(None)
        };
    };
    let mut args = Vec::new();
    let mut cur: Option<Vec<u8>> = None;
    let mut quote: Option<u8> = None;
    for &b in body {
        match (quote, b) {
            (Some(q), b) if b == q => quote = None,
            (Some(_), b) => cur.get_or_insert_with(Vec::new).push(b),
            (None, b'"' | b'\'') => {
                quote = Some(b);
                cur.get_or_insert_with(Vec::new);
            }
            (None, b' ' | b'\t') => {
                if let Some(a) = cur.take() {
                    args.push(a);
                }
            }
            (None, b) => cur.get_or_insert_with(Vec::new).push(b),
        }
    }
    if quote.is_some() {
        return Err(RespError::UnbalancedQuotes);
    }
    if let Some(a) = cur {
        args.push(a);
    }
    if args.len() > MAX_ARGS {
        return Err(RespError::BadCount(args.len() as i64));
    }
    Ok(Some((args, used)))
}

/// A reply.  `Map` is a RESP3 map, sent as a flat array of key/value pairs
/// in RESP2 (as Sentinel does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Null,
    /// A null array in RESP2 (`*-1`), as `get-master-addr-by-name` answers
    /// an unknown name; `_` in RESP3.
    NullArray,
    Array(Vec<Reply>),
    Map(Vec<(Reply, Reply)>),
}

impl Reply {
    pub fn bulk(s: impl Into<String>) -> Reply {
        Reply::Bulk(s.into().into_bytes())
    }

    /// A map of string keys and string values.
    pub fn str_map(pairs: &[(&str, String)]) -> Reply {
        Reply::Map(
            pairs
                .iter()
                .map(|(k, v)| (Reply::bulk(*k), Reply::bulk(v.clone())))
                .collect(),
        )
    }

    /// Appends the encoding for protocol version `proto` (2 or 3).
    pub fn encode(&self, proto: u8, out: &mut Vec<u8>) {
        let resp3 = proto >= 3;
        match self {
            Reply::Simple(s) => {
                out.push(b'+');
                out.extend(s.bytes().filter(|b| *b != b'\r' && *b != b'\n'));
                out.extend_from_slice(b"\r\n");
            }
            Reply::Error(s) => {
                out.push(b'-');
                out.extend(s.bytes().filter(|b| *b != b'\r' && *b != b'\n'));
                out.extend_from_slice(b"\r\n");
            }
            Reply::Int(n) => out.extend_from_slice(format!(":{n}\r\n").as_bytes()),
            Reply::Bulk(b) => {
                out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
                out.extend_from_slice(b);
                out.extend_from_slice(b"\r\n");
            }
            Reply::Null if resp3 => out.extend_from_slice(b"_\r\n"),
            Reply::Null => out.extend_from_slice(b"$-1\r\n"),
            Reply::NullArray if resp3 => out.extend_from_slice(b"_\r\n"),
            Reply::NullArray => out.extend_from_slice(b"*-1\r\n"),
            Reply::Array(items) => {
                out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
                for i in items {
                    i.encode(proto, out);
                }
            }
            Reply::Map(pairs) => {
                let head = if resp3 {
                    format!("%{}\r\n", pairs.len())
                } else {
                    format!("*{}\r\n", pairs.len() * 2)
                };
                out.extend_from_slice(head.as_bytes());
                for (k, v) in pairs {
                    k.encode(proto, out);
                    v.encode(proto, out);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<Vec<u8>> {
        v.iter().map(|s| s.as_bytes().to_vec()).collect()
    }

    #[test]
    fn whole_requests_parse_and_partial_ones_wait() {
        let req = b"*3\r\n$8\r\nSENTINEL\r\n$23\r\nget-master-addr-by-name\r\n$3\r\nrkv\r\n";
        let (a, used) = parse_request(req).unwrap_or_default().unwrap_or_default();
        assert_eq!(a, args(&["SENTINEL", "get-master-addr-by-name", "rkv"]));
        assert_eq!(used, req.len());
        for cut in 0..req.len() {
            assert_eq!(parse_request(&req[..cut]), Ok(None), "cut at {cut}");
        }
        // two pipelined: the first only
        let mut two = req.to_vec();
        two.extend_from_slice(b"*1\r\n$4\r\nPING\r\n");
        let (_, used) = parse_request(&two).unwrap_or_default().unwrap_or_default();
        assert_eq!(used, req.len());
    }

    #[test]
    fn inline_requests_split_on_spaces_and_quotes() {
        let (a, used) = parse_request(b"sentinel  masters\r\n")
            .unwrap_or_default()
            .unwrap_or_default();
        assert_eq!(a, args(&["sentinel", "masters"]));
        assert_eq!(used, 19);
        let (a, _) = parse_request(b"ping \"a b\" ''\n")
            .unwrap_or_default()
            .unwrap_or_default();
        assert_eq!(a, args(&["ping", "a b", ""]));
        assert_eq!(parse_request(b"\r\n"), Ok(Some((Vec::new(), 2))));
        assert_eq!(parse_request(b"ping"), Ok(None));
    }

    #[test]
    fn malformed_requests_are_errors_not_panics() {
        let bad: &[(&[u8], &str)] = &[
            (b"*x\r\n", "bad_length"),
            (b"*-5\r\n", "bad_count"),
            (b"*99999999\r\n", "bad_count"),
            (b"*99999999999999999999999\r\n", "bad_length"),
            (b"*1\r\n:5\r\n", "expected_bulk"),
            (b"*1\r\n$-3\r\n", "bad_length"),
            (b"*1\r\n$abc\r\n", "bad_length"),
            (b"*1\r\n$999999999\r\n", "too_long"),
            (b"*1\r\n$2\r\nabcd\r\n", "missing_crlf"),
            (b"ping \"open\r\n", "unbalanced_quotes"),
        ];
        for (input, code) in bad {
            match parse_request(input) {
                Err(e) => assert_eq!(e.code(), *code, "{:?}: {e}", String::from_utf8_lossy(input)),
                other => panic!("{:?}: {other:?}", String::from_utf8_lossy(input)),
            }
        }
        // an endless line with no CRLF is refused once past the limit
        let long = vec![b'a'; MAX_BULK + 1];
        assert!(matches!(parse_request(&long), Err(RespError::TooLong(_))));
        let mut long = b"*1\r\n$".to_vec();
        long.extend(vec![b'9'; 40]);
        assert!(parse_request(&long).is_err());
        // arbitrary bytes never panic
        let mut x: u32 = 12345;
        for _ in 0..20_000 {
            let mut buf = Vec::new();
            for _ in 0..(x % 24) {
                x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                buf.push(b"*$\r\n0123-:ab \"'"[(x >> 16) as usize % 15]);
            }
            let _ = parse_request(&buf);
        }
    }

    #[test]
    fn replies_encode_in_resp2_and_resp3() {
        let enc = |r: &Reply, p: u8| {
            let mut v = Vec::new();
            r.encode(p, &mut v);
            String::from_utf8(v).unwrap_or_default()
        };
        let m = Reply::str_map(&[("ip", "10.0.0.1".into())]);
        assert_eq!(enc(&m, 2), "*2\r\n$2\r\nip\r\n$8\r\n10.0.0.1\r\n");
        assert_eq!(enc(&m, 3), "%1\r\n$2\r\nip\r\n$8\r\n10.0.0.1\r\n");
        assert_eq!(enc(&Reply::NullArray, 2), "*-1\r\n");
        assert_eq!(enc(&Reply::NullArray, 3), "_\r\n");
        assert_eq!(enc(&Reply::Null, 2), "$-1\r\n");
        assert_eq!(enc(&Reply::Error("ERR a\r\nb".into()), 2), "-ERR ab\r\n");
        assert_eq!(enc(&Reply::Int(-3), 2), ":-3\r\n");
        assert_eq!(
            enc(&Reply::Array(vec![Reply::Simple("PONG".into())]), 2),
            "*1\r\n+PONG\r\n"
        );
    }
}
