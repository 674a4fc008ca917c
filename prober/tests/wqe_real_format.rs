//! The WQE latency parser held to the real NCCL: the format strings are read out of the
//! pinned wheel's `libnccl.so.2` (2.32.3, `tests/scripts/nccl-wheel.sh`), filled the way
//! printf fills them, and parsed back; the values that come out are the ones put in.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::OnceLock;

use railguard_prober::nccl::parse_debug_log;
use railguard_prober::nccl::wqe::{
    parse_wqe_line, wqe_faults, WqeLine, WqeLineError, WqeReport, SLOW, STALL, SUMMARY,
};

/// The library's NUL-terminated strings that start with `NET/IB: WQE `.
fn real_formats() -> &'static [String] {
    static FORMATS: OnceLock<Vec<String>> = OnceLock::new();
    FORMATS.get_or_init(|| {
        let dir = railguard_gpu::doubles::real_nccl_lib_dir().unwrap();
        let bytes = std::fs::read(dir.join("libnccl.so.2")).unwrap();
        let mut out: Vec<String> = bytes
            .split(|b| *b == 0)
            .filter_map(|s| std::str::from_utf8(s).ok())
            .filter_map(|s| s.find("NET/IB: WQE ").map(|at| s[at..].to_string()))
            .collect();
        out.sort();
        out.dedup();
        out
    })
}

fn format_with(prefix: &str) -> &'static str {
    let found: Vec<&String> = real_formats()
        .iter()
        .filter(|f| f.starts_with(prefix))
        .collect();
    assert_eq!(found.len(), 1, "{prefix:?} in {:?}", real_formats());
    found[0]
}

/// Fills a printf format as the C library would: each conversion gets the value `value`
/// picks for the key it follows (`dev=%s` -> `dev`) and its position.
fn fill(format: &str, value: impl Fn(&str, usize, char) -> String) -> String {
    let mut out = String::new();
    let mut rest = format;
    let mut n = 0;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let spec = &rest[at + 1..];
        let end = spec
            .find(|c: char| c.is_ascii_alphabetic() && c != 'l')
            .expect("a conversion character");
        let conv = spec.as_bytes()[end] as char;
        let key = out
            .rsplit(|c: char| c.is_whitespace() || c == '[')
            .next()
            .unwrap_or_default()
            .trim_end_matches('=')
            .to_string();
        out.push_str(&value(&key, n, conv));
        n += 1;
        rest = &spec[end + 1..];
    }
    out.push_str(rest);
    out
}

/// Numbers by position (distinct, so a field read from the wrong place shows), the names a
/// real run prints for the string fields.
fn sample(key: &str, n: usize, conv: char) -> String {
    match (key, conv) {
        ("dev", 's') => "mlx5_7".to_string(),
        ("peer", 's') => "10.0.0.9<43211>".to_string(),
        (_, 's') if key.ends_with("Gid") => "fe80::5a:ff:fe01:2".to_string(),
        (_, 's') => "send".to_string(),
        (_, 'f') => format!("{}", 5000 + n),
        _ => format!("{}", 1000 + n),
    }
}

#[test]
fn the_real_library_has_exactly_the_three_formats_the_parser_reads() {
    let formats = real_formats();
    assert_eq!(formats.len(), 3, "{formats:?}");
    for prefix in [SLOW, STALL, SUMMARY] {
        format_with(prefix);
    }
}

#[test]
fn a_filled_slow_line_reads_back_its_local_side() {
    let line = fill(format_with(SLOW), sample);
    let Some(Ok(WqeLine::Slow(s))) = parse_wqe_line(&line) else {
        panic!("not read: {line}");
    };
    // peer=%s is conversion 0, then local qpn, dev, port (1, 2, 3).
    assert_eq!(s.peer, "10.0.0.9<43211>");
    assert_eq!(s.qpn, 1001);
    assert_eq!(s.rail, "mlx5_7:1003");
    // After the remote side's qpn, port, lid, gid (6..9): thr, delta.
    assert_eq!((s.threshold_ns, s.delta_ns), (1010, 1011));
}

#[test]
fn a_filled_stall_line_reads_back_its_age() {
    let line = fill(format_with(STALL), sample);
    let Some(Ok(WqeLine::Stall(s))) = parse_wqe_line(&line) else {
        panic!("not read: {line}");
    };
    assert_eq!(s.rail, "mlx5_7:1003");
    assert_eq!(
        (s.stall_threshold_ns, s.age_ns, s.inflight),
        (1010, 1011, 1012)
    );
}

#[test]
fn a_filled_summary_reads_back_its_totals() {
    let line = fill(format_with(SUMMARY), sample);
    let Some(Ok(WqeLine::Summary(s))) = parse_wqe_line(&line) else {
        panic!("not read: {line}");
    };
    assert_eq!(s.role, "send");
    assert_eq!(s.rail, "mlx5_7:1004");
    assert_eq!(s.qpn, 1003);
    assert_eq!((s.completions, s.slow, s.threshold_ns), (1005, 1006, 1007));
}

#[test]
fn every_real_line_cut_anywhere_is_an_error_or_whole() {
    for prefix in [SLOW, STALL, SUMMARY] {
        let line = fill(format_with(prefix), sample);
        for cut in prefix.len()..line.len() {
            if !line.is_char_boundary(cut) {
                continue;
            }
            let cut_line = &line[..cut];
            match parse_wqe_line(cut_line) {
                Some(Err(WqeLineError::Missing { .. } | WqeLineError::NotANumber { .. })) => {}
                // A cut inside the last number still reads (a shorter number): nothing after
                // it can tell.
                Some(Ok(_)) => assert!(
                    !cut_line.ends_with('='),
                    "read a line cut at a field: {cut_line}"
                ),
                None => panic!("not a WQE line any more: {cut_line}"),
            }
        }
    }
}

#[test]
fn real_lines_in_an_nccl_log_are_rail_evidence_not_errors() {
    let slow = fill(format_with(SLOW), |k, n, c| match (k, c) {
        ("port", 'u') => "1".to_string(),
        _ => sample(k, n, c),
    });
    let stall = fill(format_with(STALL), |k, n, c| match (k, c) {
        ("dev", 's') => "mlx5_2".to_string(),
        ("port", 'u') => "1".to_string(),
        _ => sample(k, n, c),
    });
    let summary = fill(format_with(SUMMARY), |k, n, c| match (k, c) {
        ("dev", 's') => "mlx5_0".to_string(),
        ("port", 'u') => "1".to_string(),
        ("slow", 'u') => "0".to_string(),
        _ => sample(k, n, c),
    });
    let log = format!(
        "node-a:4242:4300 [3] NCCL INFO {slow}\n\
         node-a:4242:4301 [1] transport/net_ib/wqe_lat_mon.cc:120 NCCL WARN {stall}\n\
         node-a:4242:4300 [0] NCCL INFO {summary}\n"
    );
    let r = parse_debug_log(&log);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(r.wqe.ports.len(), 3, "{:?}", r.wqe);
    let rails: Vec<String> = wqe_faults(&r.wqe)
        .into_iter()
        .map(|(rail, _)| rail)
        .collect();
    // The stall fails mlx5_2; mlx5_7 is slow while mlx5_0 was clean.
    assert_eq!(rails, vec!["mlx5_2:1", "mlx5_7:1"]);
    let mut direct = WqeReport::default();
    assert!(direct.read_line(&slow));
    assert_eq!(direct.ports["mlx5_7:1"].slow_lines, 1);
}
