//! Compression of the metric endpoints' text, negotiated as upstream's
//! handlers do: `/metrics`, `/metrics/probes`, `/metrics/slis`, `/metrics/resource` and
//! `/metrics/cadvisor` are client_golang `promhttp.HandlerFor` handlers with
//! compression left on (component-base `metrics/http.go`), which offer
//! identity and gzip and pick between them with gddo's
//! `NegotiateContentEncoding` (client_golang `promhttp/http.go`,
//! `negotiateEncodingWriter`). Prometheus and every Go client (metrics-server,
//! kubectl) ask for gzip, so this is what a cluster's scrapes get: cAdvisor's
//! text at 110 pods is about 5 MB, and about 0.8 MB gzipped.

use std::io::Write;

use axum::body::Bytes;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};

/// A response body's content coding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Identity,
    Gzip,
}

/// The offers, in promhttp's order: on equal quality the earlier one wins,
/// so `Accept-Encoding: *` or `gzip, identity` gets plain text.
const OFFERS: [(&str, Encoding); 2] = [("identity", Encoding::Identity), ("gzip", Encoding::Gzip)];

/// gddo `header.ParseAccept`: `(value, quality)` per entry of every
/// `Accept-Encoding` line. A line stops at the first entry it cannot read
/// (a parameter other than `q`, a quality not starting `0` or `1`),
/// keeping the entries before it.
fn accepted(headers: &HeaderMap) -> Vec<(&str, f64)> {
    let mut specs = Vec::new();
    for line in headers.get_all(header::ACCEPT_ENCODING) {
        let Ok(mut s) = line.to_str() else { continue };
        loop {
            let end = s
                .find(|c: char| !(is_token(c) || c == '/'))
                .unwrap_or(s.len());
            let (value, rest) = s.split_at(end);
            if value.is_empty() {
                break;
            }
            let mut q = 1.0;
            s = rest.trim_start_matches([' ', '\t']);
            if let Some(p) = s.strip_prefix(';') {
                let Some(p) = p.trim_start_matches([' ', '\t']).strip_prefix("q=") else {
                    break;
                };
                let Some((qv, rest)) = quality(p) else { break };
                q = qv;
                s = rest;
            }
            specs.push((value, q));
            s = s.trim_start_matches([' ', '\t']);
            let Some(rest) = s.strip_prefix(',') else {
                break;
            };
            s = rest.trim_start_matches([' ', '\t']);
        }
    }
    specs
}

/// RFC 7230 token characters.
fn is_token(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c)
}

/// gddo `expectQuality`: `0` or `1`, then optionally `.` and digits.
fn quality(s: &str) -> Option<(f64, &str)> {
    let q = match s.as_bytes().first()? {
        b'0' => 0.0,
        b'1' => 1.0,
        _ => return None,
    };
    let s = &s[1..];
    let Some(frac) = s.strip_prefix('.') else {
        return Some((q, s));
    };
    let end = frac
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(frac.len());
    let (mut n, mut d) = (0.0, 1.0);
    for b in frac[..end].bytes() {
        n = n * 10.0 + f64::from(b - b'0');
        d *= 10.0;
    }
    Some((q + n / d, &frac[end..]))
}

/// The coding for a request's `Accept-Encoding`: the offer with the highest
/// quality (a `*` entry matching either), identity when none is named or
/// the best has quality 0 (promhttp falls back to identity then).
pub fn negotiate(headers: &HeaderMap) -> Encoding {
    let specs = accepted(headers);
    let (mut best, mut best_q) = (Encoding::Identity, -1.0);
    for (name, enc) in OFFERS {
        for &(value, q) in &specs {
            if q > best_q && (value == "*" || value == name) {
                (best, best_q) = (enc, q);
            }
        }
    }
    if best_q == 0.0 {
        return Encoding::Identity;
    }
    best
}

/// Encodes `chunks` (CPU work: call off the async threads for large
/// bodies). Level 1, where Go's gzip writer defaults to 6: at 5 MB of
/// cAdvisor text it costs 15 ms rather than 86 ms for an output 1 % larger.
pub fn encode(enc: Encoding, chunks: Vec<Bytes>) -> Vec<Bytes> {
    match enc {
        Encoding::Identity => chunks,
        Encoding::Gzip => {
            let total: usize = chunks.iter().map(|c| c.len()).sum();
            if total >= PARALLEL_GZIP_MIN {
                if let Some(gz) = gzip_on_two_threads(&chunks) {
                    return vec![Bytes::from(gz)];
                }
            }
            // The text compresses about 6-fold.
            let out = Vec::with_capacity(total / 5 + 64);
            let mut gz = flate2::write::GzEncoder::new(out, flate2::Compression::fast());
            for c in &chunks {
                // Writing into a Vec cannot fail.
                let _ = gz.write_all(c);
            }
            vec![Bytes::from(gz.finish().unwrap_or_default())]
        }
    }
}

/// From this size (cAdvisor's text with more than a few dozen pods) a gzip
/// body is compressed in two halves on two threads.
const PARALLEL_GZIP_MIN: usize = 1 << 20;

/// One gzip member compressed in two halves at once, as pigz does: the
/// first half's deflate stream ends on a sync flush (a byte-aligned empty
/// stored block, not final), the second is a stream of its own that ends
/// the member, and the CRC-32 of the whole is combined from the halves'.
/// The second half cannot refer back into the first, which costs a few
/// bytes. flate2 has no parallel encoder and its `Compress` gives the sync
/// flush, so only the 10-byte header and 8-byte trailer are written here.
/// `None` when the body is one chunk or deflate fails.
fn gzip_on_two_threads(chunks: &[Bytes]) -> Option<Vec<u8>> {
    let (first, second) = chunks.split_at(crate::blocking::half_point(chunks, Bytes::len));
    if first.is_empty() || second.is_empty() {
        return None;
    }
    let (a, b, _) = crate::blocking::halves(
        "gzip",
        || deflate_part(first, false),
        || deflate_part(second, true),
    );
    let (a, b) = (a?, b?);
    let (mut out, mut crc, len_a) = a;
    let (tail, crc_b, len_b) = b;
    out.extend_from_slice(&tail);
    crc.combine(&crc_b);
    out.extend_from_slice(&crc.finalize().to_le_bytes());
    // ISIZE: the input's length modulo 2^32 (RFC 1952).
    out.extend_from_slice(&((len_a + len_b) as u32).to_le_bytes());
    Some(out)
}

/// A raw deflate stream of `parts` (behind a gzip header when it is the
/// first half), ending the stream when `last`, else on a sync flush; with
/// the parts' CRC-32 and length.
fn deflate_part(parts: &[Bytes], last: bool) -> Option<(Vec<u8>, crc32fast::Hasher, usize)> {
    use flate2::{Compress, Compression, FlushCompress, Status};
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let mut out = Vec::with_capacity(len / 5 + 64);
    if !last {
        // ID1 ID2, deflate, no flags, no mtime, XFL 4 (fastest), OS unknown.
        out.extend_from_slice(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 4, 0xff]);
    }
    let mut z = Compress::new(Compression::fast(), false);
    let mut crc = crc32fast::Hasher::new();
    for (i, p) in parts.iter().enumerate() {
        crc.update(p);
        let flush = match (i + 1 == parts.len(), last) {
            (false, _) => FlushCompress::None,
            (true, true) => FlushCompress::Finish,
            (true, false) => FlushCompress::Sync,
        };
        let mut input: &[u8] = p;
        loop {
            if out.capacity() - out.len() < 4096 {
                out.reserve(out.capacity().max(64 * 1024));
            }
            let before = z.total_in();
            let status = z.compress_vec(input, &mut out, flush).ok()?;
            input = &input[(z.total_in() - before) as usize..];
            let room_left = out.len() < out.capacity();
            let done = match flush {
                FlushCompress::Finish => status == Status::StreamEnd,
                // Flushed once input is taken and output had room to spare.
                _ => input.is_empty() && room_left,
            };
            if done {
                break;
            }
        }
    }
    Some((out, crc, len))
}

/// A Prometheus text response of `chunks`, already encoded as `enc`
/// (`Content-Encoding` set only when compressed, as promhttp).
pub fn text_response(enc: Encoding, chunks: Vec<Bytes>) -> Response {
    let mut resp = (
        [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
        axum::body::Body::new(crate::stats::expo::ChunkBody::new(chunks)),
    )
        .into_response();
    if enc == Encoding::Gzip {
        resp.headers_mut()
            .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body past `PARALLEL_GZIP_MIN` is one gzip member made of two
    /// deflate halves: a plain gzip reader (which checks the CRC-32 and
    /// length) reads back the exact text, whatever the chunk boundaries.
    #[test]
    fn a_large_body_gzipped_in_two_halves_reads_back_whole() {
        use std::io::Read;
        let line = |i: usize| {
            format!("container_cpu_usage_seconds_total{{id=\"/kubepods/pod{i}\"}} {i}.5 1700000000000\n")
        };
        let mut chunks = Vec::new();
        let mut total = 0;
        let mut i = 0;
        while total < 3 * PARALLEL_GZIP_MIN {
            let mut c = String::new();
            // Families of uneven sizes, as cAdvisor's are.
            for _ in 0..(1 + i % 7) * 500 {
                c.push_str(&line(i));
                i += 1;
            }
            total += c.len();
            chunks.push(Bytes::from(c));
        }
        let whole: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
        let two = gzip_on_two_threads(&chunks).expect("two halves");
        let gz = encode(Encoding::Gzip, chunks.clone());
        assert_eq!(gz.len(), 1);
        for body in [&two[..], &gz[0][..]] {
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(body)
                .read_to_end(&mut out)
                .unwrap();
            assert!(out == whole, "{} bytes back of {}", out.len(), whole.len());
        }
        // One chunk cannot be split: the single-thread encoder is used.
        assert!(gzip_on_two_threads(&chunks[..1]).is_none());
    }

    fn with(lines: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for l in lines {
            h.append(header::ACCEPT_ENCODING, HeaderValue::from_str(l).unwrap());
        }
        h
    }

    #[test]
    fn gzip_is_chosen_only_when_it_is_the_best_offer() {
        use Encoding::*;
        let cases: &[(&[&str], Encoding)] = &[
            // No header: promhttp writes plain text.
            (&[], Identity),
            // Prometheus' scrapes and Go's transport.
            (&["gzip"], Gzip),
            (&["gzip, deflate, br"], Gzip),
            // curl --compressed.
            (&["deflate, gzip, br, zstd"], Gzip),
            // A tie goes to the earlier offer, identity.
            (&["*"], Identity),
            (&["gzip, identity"], Identity),
            (&["identity;q=0.5, gzip"], Gzip),
            (&["gzip;q=0.5, identity;q=0.8"], Identity),
            (&["*;q=0.5, gzip"], Gzip),
            (&["gzip;q=0.001"], Gzip),
            // Quality 0 refuses; promhttp then falls back to identity.
            (&["gzip;q=0"], Identity),
            // Values compare as written (gddo does not fold case).
            (&["GZIP"], Identity),
            (&["br, zstd"], Identity),
            // A line stops at what it cannot read; earlier entries count,
            // and so do other lines.
            (&["br, gzip;level=9"], Identity),
            (&["gzip;q=2"], Identity),
            (&["gzip ;q=1.0 , br"], Gzip),
            (&["br;foo", "gzip"], Gzip),
        ];
        for (lines, want) in cases {
            assert_eq!(negotiate(&with(lines)), *want, "{lines:?}");
        }
    }

    #[test]
    fn qualities_are_read_as_gddo_reads_them() {
        assert_eq!(quality("1"), Some((1.0, "")));
        assert_eq!(quality("0.5, x"), Some((0.5, ", x")));
        assert_eq!(quality("0.125"), Some((0.125, "")));
        assert_eq!(quality("1.000;"), Some((1.0, ";")));
        assert_eq!(quality(".5"), None);
        assert_eq!(quality("2"), None);
        assert_eq!(quality(""), None);
    }

    #[test]
    fn gzip_round_trips_the_chunks() {
        let chunks = vec![
            Bytes::from_static(b"# TYPE a gauge\na 1\n"),
            Bytes::new(),
            Bytes::from("b{x=\"y\"} 2 3\n".repeat(1000)),
        ];
        let plain: Vec<u8> = chunks.iter().flat_map(|c| c.to_vec()).collect();
        assert_eq!(encode(Encoding::Identity, chunks.clone()), chunks);
        let gz = encode(Encoding::Gzip, chunks);
        assert_eq!(gz.len(), 1);
        assert!(gz[0].len() < plain.len() / 10, "{} bytes", gz[0].len());
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[0][..]), &mut out)
            .unwrap();
        assert_eq!(out, plain);
    }
}
