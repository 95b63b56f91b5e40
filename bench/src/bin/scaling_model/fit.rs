//! Alpha-beta fits of measured all-reduce times: `t(n) = a + n / b` per band of message sizes
//! (a protocol change, LL against Simple say, moves both terms), fitted by least squares on
//! the relative error so small and large messages count alike.

use serde_json::Value;

/// One measured all-reduce: message bytes and microseconds per call.
#[derive(Clone, Copy, Debug)]
pub struct Point {
    pub bytes: f64,
    pub us: f64,
}

/// `t = a_us + bytes / (gbps * 1e3)` microseconds for sizes up to `hi` bytes.
#[derive(Clone, Copy, Debug)]
pub struct Band {
    pub hi: f64,
    pub a_us: f64,
    pub gbps: f64,
}

/// A fitted series: its name and its bands in order of size.
#[derive(Clone, Debug)]
pub struct Fit {
    pub name: String,
    pub bands: Vec<Band>,
}

/// The band edges: up to 64 KiB, up to 4 MiB, above.
pub const EDGES: [f64; 3] = [65536.0, 4194304.0, f64::INFINITY];

impl Fit {
    pub fn band(&self, bytes: f64) -> Band {
        *self
            .bands
            .iter()
            .find(|b| bytes <= b.hi)
            .unwrap_or_else(|| self.bands.last().expect("a fit has bands"))
    }

    pub fn predict_us(&self, bytes: f64) -> f64 {
        let b = self.band(bytes);
        b.a_us + bytes / (b.gbps * 1e3)
    }
}

/// The least-squares `(a, 1/b)` of `t = a + n c` weighted by `1/t^2`; `a` and `c` kept >= 0.
fn fit_line(points: &[Point]) -> (f64, f64) {
    let (mut sw, mut sx, mut sxx, mut sy, mut sxy) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for p in points {
        let w = 1.0 / (p.us * p.us);
        sw += w;
        sx += w * p.bytes;
        sxx += w * p.bytes * p.bytes;
        sy += w * p.us;
        sxy += w * p.bytes * p.us;
    }
    let det = sw * sxx - sx * sx;
    let (a, c) = if points.len() >= 2 && det.abs() > 0.0 {
        ((sy * sxx - sx * sxy) / det, (sw * sxy - sx * sy) / det)
    } else {
        (sy / sw, 0.0)
    };
    if c <= 0.0 {
        (sy / sw, 0.0)
    } else if a < 0.0 {
        (0.0, sxy / sxx)
    } else {
        (a, c)
    }
}

/// Fits every band that has points; a band without points takes its neighbour's fit.
pub fn fit(name: &str, points: &[Point]) -> Fit {
    let mut bands = vec![];
    let mut lo = 0.0;
    for hi in EDGES {
        let inside: Vec<Point> = points.iter().copied().filter(|p| p.bytes > lo && p.bytes <= hi).collect();
        if !inside.is_empty() {
            let (a, c) = fit_line(&inside);
            bands.push(Band { hi, a_us: a, gbps: if c > 0.0 { 1.0 / (c * 1e3) } else { f64::INFINITY } });
        } else if let Some(last) = bands.last_mut() {
            last.hi = hi;
        }
        lo = hi;
    }
    assert!(!bands.is_empty(), "{name}: no points to fit");
    Fit { name: name.to_string(), bands }
}

/// The f32 all-reduce rows `all_reduce_{series}_f32_{n}B` of a results file (comm-bench's
/// names; `series` is e.g. `nccl_2r`), as points.
pub fn points(doc: &Value, series: &str) -> Vec<Point> {
    let prefix = format!("all_reduce_{series}_f32_");
    let mut out: Vec<Point> = doc["benchmarks"]
        .as_array()
        .map(|a| a.as_slice())
        .unwrap_or_default()
        .iter()
        .filter_map(|b| {
            let name = b["name"].as_str()?;
            let bytes: f64 = name.strip_prefix(&prefix)?.strip_suffix('B')?.parse().ok()?;
            Some(Point { bytes, us: b["oxtrain"].as_f64()? })
        })
        .collect();
    out.sort_by(|a, b| a.bytes.total_cmp(&b.bytes));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_recovered_in_each_band() {
        let pts: Vec<Point> = (3..30)
            .map(|k| {
                let n = (1u64 << k) as f64;
                let us = if n <= EDGES[0] { 2.0 + n / 10e3 } else { 8.0 + n / 300e3 };
                Point { bytes: n, us }
            })
            .collect();
        let f = fit("t", &pts);
        assert!((f.bands[0].a_us - 2.0).abs() < 1e-6 && (f.bands[0].gbps - 10.0).abs() < 1e-6, "{f:?}");
        assert!((f.bands[2].a_us - 8.0).abs() < 1e-6 && (f.bands[2].gbps - 300.0).abs() < 1e-3, "{f:?}");
        assert!((f.predict_us(1e9) - (8.0 + 1e9 / 300e3)).abs() < 1e-3);
    }
}
