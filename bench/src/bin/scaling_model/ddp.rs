//! One data-parallel step on the timeline of one GPU's measured step: DDP's buckets (in
//! reverse registration order, the first capped at 1 MiB, the rest at 25 MiB, fp32
//! gradients), each launched when its last gradient is ready and reduced one after another
//! on the communication stream. With overlap a bucket starts as soon as it is ready and the
//! previous one is done; without, all of them run after backward.

use serde_json::Value;

/// A model's measured step on one GPU.
#[derive(Clone, Debug)]
pub struct Profile {
    pub name: String,
    pub forward_ms: f64,
    pub backward_ms: f64,
    pub optimizer_ms: f64,
    /// (element count, ms from the start of backward to its gradient being final), in
    /// registration order.
    pub params: Vec<(usize, f64)>,
}

impl Profile {
    pub fn from_json(m: &Value) -> Option<Profile> {
        Some(Profile {
            name: m["name"].as_str()?.to_string(),
            forward_ms: m["forward_ms"].as_f64()?,
            backward_ms: m["backward_ms"].as_f64()?,
            optimizer_ms: m["optimizer_ms"].as_f64()?,
            params: m["params"]
                .as_array()?
                .iter()
                .map(|p| Some((p["numel"].as_u64()? as usize, p["ready_ms"].as_f64()?)))
                .collect::<Option<Vec<_>>>()?,
        })
    }

    pub fn compute_ms(&self) -> f64 {
        self.forward_ms + self.backward_ms + self.optimizer_ms
    }

    pub fn grad_bytes(&self) -> f64 {
        self.params.iter().map(|p| 4.0 * p.0 as f64).sum()
    }
}

/// A bucket: its bytes and when its last gradient is ready (ms from the start of backward).
#[derive(Clone, Copy, Debug)]
pub struct Bucket {
    pub bytes: f64,
    pub ready_ms: f64,
}

/// PyTorch's bucketing: parameters in reverse order, a bucket closes once it holds `cap`
/// bytes (the first `first_cap`).
pub fn buckets(profile: &Profile, first_cap: f64, cap: f64) -> Vec<Bucket> {
    let mut out = vec![];
    let mut cur = Bucket { bytes: 0.0, ready_ms: 0.0 };
    for &(numel, ready) in profile.params.iter().rev() {
        cur.bytes += 4.0 * numel as f64;
        cur.ready_ms = cur.ready_ms.max(ready);
        let limit = if out.is_empty() { first_cap } else { cap };
        if cur.bytes >= limit {
            out.push(cur);
            cur = Bucket { bytes: 0.0, ready_ms: 0.0 };
        }
    }
    if cur.bytes > 0.0 {
        out.push(cur);
    }
    out
}

/// The predicted step: its time, and the communication left exposed after backward.
#[derive(Clone, Copy, Debug)]
pub struct Step {
    pub step_ms: f64,
    pub exposed_ms: f64,
    pub comm_ms: f64,
}

/// The step with each bucket's all-reduce taking `ar_ms(bytes)`.
pub fn step(profile: &Profile, buckets: &[Bucket], overlap: bool, ar_ms: impl Fn(f64) -> f64) -> Step {
    let mut end = 0.0f64;
    let mut comm = 0.0;
    for b in buckets {
        let t = ar_ms(b.bytes);
        comm += t;
        let start = if overlap { b.ready_ms.max(end) } else { profile.backward_ms.max(end) };
        end = start + t;
    }
    let after_backward = (end - profile.backward_ms).max(0.0);
    Step {
        step_ms: profile.forward_ms + profile.backward_ms + after_backward + profile.optimizer_ms,
        exposed_ms: after_backward,
        comm_ms: comm,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile() -> Profile {
        // Four parameters of 1 MiB each, ready at 1, 2, 3, 4 ms of a 4 ms backward (the last
        // registered is ready first).
        let p = 262144;
        Profile {
            name: "t".into(),
            forward_ms: 2.0,
            backward_ms: 4.0,
            optimizer_ms: 0.5,
            params: vec![(p, 4.0), (p, 3.0), (p, 2.0), (p, 1.0)],
        }
    }

    #[test]
    fn buckets_close_at_their_caps_in_reverse_order() {
        let b = buckets(&profile(), 1048576.0, 2097152.0);
        assert_eq!(b.len(), 3);
        assert_eq!((b[0].bytes, b[0].ready_ms), (1048576.0, 1.0));
        assert_eq!((b[1].bytes, b[1].ready_ms), (2097152.0, 3.0));
        assert_eq!((b[2].bytes, b[2].ready_ms), (1048576.0, 4.0));
    }

    #[test]
    fn overlap_hides_what_fits_under_backward() {
        let p = profile();
        let b = buckets(&p, 1048576.0, 2097152.0);
        // 0.5 ms per MiB: buckets end at 1.5, 4.0, 4.5 ms: 0.5 ms exposed.
        let s = step(&p, &b, true, |bytes| bytes / 1048576.0 * 0.5);
        assert!((s.exposed_ms - 0.5).abs() < 1e-12 && (s.step_ms - 7.0).abs() < 1e-12, "{s:?}");
        let s = step(&p, &b, false, |bytes| bytes / 1048576.0 * 0.5);
        assert!((s.exposed_ms - 2.0).abs() < 1e-12 && (s.comm_ms - 2.0).abs() < 1e-12, "{s:?}");
    }
}
