//! All-reduce time on N nodes of g ranks from per-step alpha-beta links: a flat ring over
//! every rank (NCCL's ring: 2(P-1) pipelined steps, 2N of them across the network) and the
//! hierarchical all-reduce (reduce-scatter inside the node, all-reduce of each rank's 1/g
//! share across nodes between the ranks of the same local rank (a rail), all-gather inside
//! the node), as the staged NVSHMEM path does. Stages run one after the other, unpipelined.

use crate::fit::Fit;

/// A link by band of message size: per-step latency and bandwidth.
#[derive(Clone, Debug)]
pub struct Link {
    pub name: String,
    /// (largest message of the band in bytes, alpha per step in us, GB/s)
    pub bands: Vec<(f64, f64, f64)>,
}

impl Link {
    /// From a fit of the all-reduce of 2 ranks, a ring of 2 steps: alpha = a / 2 per step, and
    /// the bandwidth as fitted (the bus bandwidth of 2 ranks equals the algorithm bandwidth).
    pub fn from_two_rank_fit(fit: &Fit) -> Link {
        Link {
            name: fit.name.clone(),
            bands: fit.bands.iter().map(|b| (b.hi, b.a_us / 2.0, b.gbps)).collect(),
        }
    }

    pub fn at(&self, bytes: f64) -> (f64, f64) {
        let b = self.bands.iter().find(|b| bytes <= b.0).unwrap_or_else(|| self.bands.last().expect("bands"));
        (b.1, b.2)
    }
}

/// A machine: nodes of `g` ranks joined inside by `intra`, and `nics` network ports per node
/// (`inter` each) between nodes.
#[derive(Clone, Debug)]
pub struct Cluster {
    pub g: usize,
    pub nics: usize,
    pub intra: Link,
    pub inter: Link,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algo {
    Flat,
    Hierarchical,
    /// Open MPI's own choice for the mpi backend's MPI_Iallreduce (its libnbc component,
    /// `nbc_iallreduce.c`): below 64 KiB (or under 4 ranks) a binomial tree, reduce up and
    /// broadcast down, log2(g) rounds inside the node and log2(N) across each way, every
    /// round a message of the whole buffer; above, reduce-scatter + all-gather, whose
    /// bandwidth term is the ring's (taken here with the ring's latency). For the CPU check
    /// only (powers of two).
    OpenMpiDefault,
}

impl Algo {
    pub fn name(self) -> &'static str {
        match self {
            Algo::Flat => "flat ring",
            Algo::Hierarchical => "hierarchical",
            Algo::OpenMpiDefault => "libnbc's binomial tree below 64 KiB, ring above",
        }
    }
}

/// Ring all-reduce of `bytes` over `p` ranks on one link kind.
fn ring(bytes: f64, p: usize, link: &Link, share: f64) -> f64 {
    if p <= 1 {
        return 0.0;
    }
    let (alpha, gbps) = link.at(bytes);
    let p = p as f64;
    2.0 * (p - 1.0) * alpha + 2.0 * (p - 1.0) / p * bytes / (gbps * share * 1e3)
}

/// Reduce-scatter (or all-gather) of `bytes` over `p` ranks: half a ring.
fn half_ring(bytes: f64, p: usize, link: &Link) -> f64 {
    ring(bytes, p, link, 1.0) / 2.0
}

impl Cluster {
    /// Microseconds of one all-reduce of `bytes` per rank over `nodes` nodes.
    pub fn all_reduce_us(&self, bytes: f64, nodes: usize, algo: Algo) -> f64 {
        let g = self.g;
        let p = nodes * g;
        if nodes <= 1 {
            return ring(bytes, g, &self.intra, 1.0);
        }
        match algo {
            Algo::Flat => {
                let (a_in, b_in) = self.intra.at(bytes);
                let (a_net, b_net) = self.inter.at(bytes);
                let steps = 2.0 * (p as f64 - 1.0);
                let net_steps = 2.0 * nodes as f64;
                // One ring per NIC, side by side: each carries 1/nics of the data through its
                // NIC, and every rank's ring traffic also crosses its intra-node link.
                let gbps = b_in.min(self.nics as f64 * b_net);
                (steps - net_steps).max(0.0) * a_in
                    + net_steps * a_net
                    + 2.0 * (p as f64 - 1.0) / p as f64 * bytes / (gbps * 1e3)
            }
            Algo::Hierarchical => {
                // The g rails share the node's NICs.
                let share = (self.nics.min(g) as f64) / g as f64;
                2.0 * half_ring(bytes, g, &self.intra) + ring(bytes / g as f64, nodes, &self.inter, share)
            }
            Algo::OpenMpiDefault if bytes >= 65536.0 && p >= 4 => {
                self.all_reduce_us(bytes, nodes, Algo::Flat)
            }
            Algo::OpenMpiDefault => {
                // A 2-rank all-reduce is one message up and one down: the fits' `a + n/b`.
                let rounds = |n: usize| (n as f64).log2().ceil();
                rounds(g) * ring(bytes, 2, &self.intra, 1.0)
                    + rounds(nodes) * ring(bytes, 2, &self.inter, 1.0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(alpha: f64, gbps: f64) -> Link {
        Link { name: "l".into(), bands: vec![(f64::INFINITY, alpha, gbps)] }
    }

    #[test]
    fn one_node_is_a_ring_and_both_algorithms_agree_there() {
        let c = Cluster { g: 8, nics: 8, intra: link(1.0, 300.0), inter: link(3.0, 50.0) };
        let n = 1e8;
        let want = 14.0 * 1.0 + 2.0 * 7.0 / 8.0 * n / 300e3;
        assert!((c.all_reduce_us(n, 1, Algo::Flat) - want).abs() < 1e-6);
        assert_eq!(c.all_reduce_us(n, 1, Algo::Flat), c.all_reduce_us(n, 1, Algo::Hierarchical));
    }

    #[test]
    fn hierarchical_has_fewer_network_steps_at_scale() {
        let c = Cluster { g: 8, nics: 8, intra: link(1.0, 300.0), inter: link(3.0, 50.0) };
        // A small message is latency: the flat ring's 2(P-1) steps against 2(g-1) + 2(N-1).
        let (flat, hier) =
            (c.all_reduce_us(1024.0, 128, Algo::Flat), c.all_reduce_us(1024.0, 128, Algo::Hierarchical));
        assert!(hier < flat / 2.0, "{hier} vs {flat}");
    }
}
