//! The text as client_golang's `Gather` and expfmt lay it out, from
//! prometheus-client's (registration order, map order, `_sum`/`_count`
//! before buckets, Rust float text, families without series): families
//! without series left out and the rest sorted by name; a family's
//! series sorted by their label values (labels in name order,
//! `internal.MetricSorter`); a histogram series' buckets, then `_sum`, then
//! `_count`; and `le` bounds written as Go's `strconv.FormatFloat(v, 'g',
//! -1, 64)` writes them (`1`, not `1.0`; `1.048576e+06`). The bounds are
//! label values, so queries and dashboards written against upstream's
//! (`le="1"`) need upstream's spelling.

/// One sample line's label values (in the order written) and its bucket
/// bound, if any.
struct Sample<'a> {
    line: &'a str,
    /// `_bucket` 0, `_sum` 1, `_count` 2, anything else 0.
    part: u8,
    values: Vec<String>,
    le: Option<String>,
}

/// The label pairs of a sample line, in the order written, values
/// unescaped.
pub(super) fn labels(line: &str) -> Vec<(String, String)> {
    let Some(open) = line.find('{') else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let (mut name, mut value) = (String::new(), String::new());
    let (mut in_value, mut escaped) = (false, false);
    for c in line[open + 1..].chars() {
        if in_value {
            match (escaped, c) {
                (true, c) => {
                    value.push(if c == 'n' { '\n' } else { c });
                    escaped = false;
                }
                (false, '\\') => escaped = true,
                (false, '"') => {
                    in_value = false;
                    out.push((std::mem::take(&mut name), std::mem::take(&mut value)));
                }
                (false, c) => value.push(c),
            }
            continue;
        }
        match c {
            '"' => in_value = true,
            '=' | ',' => {}
            '}' => return out,
            c => name.push(c),
        }
    }
    out
}

/// Go's `strconv.FormatFloat(v, 'g', -1, 64)`, and `+Inf`/`-Inf`/`NaN` as
/// expfmt writes them; `None` for text that is not a number.
pub(super) fn go_float(text: &str) -> Option<String> {
    match text {
        "+Inf" | "-Inf" | "NaN" => return Some(text.to_string()),
        _ => {}
    }
    let v: f64 = text.parse().ok()?;
    if v == 0.0 {
        return Some("0".into());
    }
    // Shortest digits, as Go's -1 precision; `%e` when the decimal
    // exponent is below -4 or at least 6 ('g' decides with precision 6
    // when asked for the shortest).
    let sci = format!("{v:e}");
    let (mantissa, exp) = sci.split_once('e')?;
    let exp: i32 = exp.parse().ok()?;
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        return Some(format!("{mantissa}e{sign}{:02}", exp.abs()));
    }
    Some(format!("{v}"))
}

fn sample<'a>(line: &'a str, family: &str) -> Sample<'a> {
    let name_end = line.find(['{', ' ']).unwrap_or(line.len());
    let part = match line[..name_end].strip_prefix(family) {
        Some("_sum") => 1,
        Some("_count") => 2,
        _ => 0,
    };
    let pairs = labels(line);
    let mut values = Vec::with_capacity(pairs.len());
    let mut le = None;
    for (n, v) in pairs {
        if n == "le" {
            le = Some(v);
        } else {
            values.push(v);
        }
    }
    Sample {
        line,
        part,
        values,
        le,
    }
}

/// A bucket line with its `le` after the series' own labels, where
/// expfmt writes it (prometheus-client writes it first), and its value
/// spelled as Go spells it.
fn with_go_le(line: &str) -> String {
    let Some(open) = line.find('{') else {
        return line.to_string();
    };
    // The pair starts the label set or follows a comma.
    let Some(at) = ["{le=\"", ",le=\""]
        .iter()
        .find_map(|p| line[open..].find(p).map(|i| open + i + 1))
    else {
        return line.to_string();
    };
    let start = at + 4;
    // A bound is a number or +Inf: no quote or escape inside.
    let Some(len) = line[start..].find('"') else {
        return line.to_string();
    };
    let raw = &line[start..start + len];
    let le = format!(
        "le=\"{}\"",
        go_float(raw).unwrap_or_else(|| raw.to_string())
    );
    let after = &line[start + len + 1..];
    match after.strip_prefix(',') {
        // First of several: the others, then the bound.
        Some(others) if line.as_bytes()[at - 1] == b'{' => {
            let close = others.rfind('}').unwrap_or(others.len());
            format!(
                "{}{},{le}{}",
                &line[..at],
                &others[..close],
                &others[close..]
            )
        }
        _ => format!("{}{le}{after}", &line[..at]),
    }
}

/// Family `name`'s lines (its `# HELP` and `# TYPE` first) laid out as
/// client_golang does.
fn family(name: &str, lines: &[&str], out: &mut String) {
    let comments = lines.iter().take_while(|l| l.starts_with('#')).count();
    for l in &lines[..comments] {
        out.push_str(l);
        out.push('\n');
    }
    // A counter's TYPE line names its `_total` samples: the base is what
    // `_sum`/`_count`/`_bucket` follow, and only histograms have those.
    let mut samples: Vec<(usize, Sample<'_>)> = lines[comments..]
        .iter()
        .map(|l| sample(l, name))
        .enumerate()
        .collect();
    // Stable: buckets keep their ascending order within a series.
    samples.sort_by(|(ia, a), (ib, b)| {
        a.values
            .cmp(&b.values)
            .then(a.part.cmp(&b.part))
            .then(ia.cmp(ib))
    });
    for (_, s) in samples {
        if s.le.is_some() {
            out.push_str(&with_go_le(s.line));
        } else {
            out.push_str(s.line);
        }
        out.push('\n');
    }
}

/// The whole text, reordered (see the module documentation).
pub(super) fn reorder(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    // Families start at their `# HELP` (or a `# TYPE` without one).
    let mut starts: Vec<usize> = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let starts_family = l.starts_with("# HELP ")
            || (l.starts_with("# TYPE ") && (i == 0 || !lines[i - 1].starts_with("# HELP ")));
        if starts_family || (i == 0 && !l.starts_with('#')) {
            starts.push(i);
        }
    }
    let mut families: Vec<(&str, &[&str])> = starts
        .iter()
        .enumerate()
        .map(|(k, &s)| {
            let end = starts.get(k + 1).copied().unwrap_or(lines.len());
            let block = &lines[s..end];
            let name = block
                .iter()
                .find_map(|l| {
                    l.strip_prefix("# HELP ")
                        .or_else(|| l.strip_prefix("# TYPE "))
                })
                .and_then(|r| r.split(' ').next())
                .unwrap_or("");
            (name, block)
        })
        .collect();
    families.sort_by(|a, b| a.0.cmp(b.0));
    let mut out = String::with_capacity(text.len());
    // A family without series is left out (Gather prunes empty families).
    for (name, block) in families
        .into_iter()
        .filter(|(_, b)| b.iter().any(|l| !l.starts_with('#')))
    {
        family(name, block, &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_are_written_as_go_writes_them() {
        for (rust, go) in [
            ("1.0", "1"),
            ("0.005", "0.005"),
            ("2.5", "2.5"),
            ("10.0", "10"),
            ("3600.0", "3600"),
            ("745.0634841918945", "745.0634841918945"),
            ("1048576.0", "1.048576e+06"),
            ("16777216.0", "1.6777216e+07"),
            ("0.00001", "1e-05"),
            ("0.0001", "0.0001"),
            ("+Inf", "+Inf"),
            ("0.0", "0"),
        ] {
            assert_eq!(go_float(rust).as_deref(), Some(go), "{rust}");
        }
        assert_eq!(go_float("x"), None);
    }

    #[test]
    fn families_series_and_histogram_parts_come_in_client_golangs_order() {
        let text = "\
# HELP z_total [ALPHA] z.
# TYPE z_total counter
z_total{a=\"b\"} 1
z_total{a=\"a b\"} 2
z_total{a=\"a\"} 3
# HELP h [ALPHA] h.
# TYPE h histogram
h_sum{op=\"sync\"} 0.5
h_count{op=\"sync\"} 1
h_bucket{op=\"sync\",le=\"1.0\"} 1
h_bucket{op=\"sync\",le=\"+Inf\"} 1
h_sum{op=\"create\"} 2.0
h_count{op=\"create\"} 1
h_bucket{op=\"create\",le=\"1.0\"} 0
h_bucket{op=\"create\",le=\"+Inf\"} 1
";
        assert_eq!(
            reorder(text),
            "\
# HELP h [ALPHA] h.
# TYPE h histogram
h_bucket{op=\"create\",le=\"1\"} 0
h_bucket{op=\"create\",le=\"+Inf\"} 1
h_sum{op=\"create\"} 2.0
h_count{op=\"create\"} 1
h_bucket{op=\"sync\",le=\"1\"} 1
h_bucket{op=\"sync\",le=\"+Inf\"} 1
h_sum{op=\"sync\"} 0.5
h_count{op=\"sync\"} 1
# HELP z_total [ALPHA] z.
# TYPE z_total counter
z_total{a=\"a\"} 3
z_total{a=\"a b\"} 2
z_total{a=\"b\"} 1
"
        );
    }
}
