//! Which checkpoints to delete: all but the newest `keep_last`, except multiples of `keep_every`.

/// The steps of `steps` (committed checkpoints, any order) that retention removes.
pub fn to_remove(steps: &[u64], keep_last: Option<usize>, keep_every: Option<u64>) -> Vec<u64> {
    let Some(keep_last) = keep_last else { return Vec::new() };
    let mut sorted = steps.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    sorted.dedup();
    sorted
        .into_iter()
        .skip(keep_last.max(1))
        .filter(|s| !keep_every.is_some_and(|n| n > 0 && s.is_multiple_of(n)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::to_remove;

    #[test]
    fn keeps_the_newest_and_every_nth() {
        let steps: Vec<u64> = (1..=10).map(|s| s * 100).collect();
        let mut removed = to_remove(&steps, Some(2), Some(400));
        removed.sort();
        assert_eq!(removed, vec![100, 200, 300, 500, 600, 700]);
        assert!(to_remove(&steps, None, None).is_empty());
        // keep_last 0 would delete the checkpoint just written; it keeps one.
        assert_eq!(to_remove(&[5, 7], Some(0), None), vec![5]);
    }
}
