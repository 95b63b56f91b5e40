//! Who am I: rank, world size and local rank from the launcher's environment.
//!
//! Read in this order (the first launcher whose variables are set wins): torchrun
//! (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`), Open MPI's mpirun
//! (`OMPI_COMM_WORLD_RANK`, `_SIZE`, `_LOCAL_RANK`, `_LOCAL_SIZE`), Slurm's srun
//! (`SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`, `SLURM_NTASKS_PER_NODE`), else a single
//! process. The store's address is `MASTER_ADDR`/`MASTER_PORT` in every case.

use crate::error::{CommError, Result};

/// Which launcher started this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    Torchrun,
    OpenMpi,
    Slurm,
    /// No launcher variables: one process alone.
    Single,
}

/// A process's place in the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchEnv {
    pub rank: usize,
    pub world_size: usize,
    pub local_rank: usize,
    pub local_world_size: usize,
    /// Where rank 0 hosts the store (`MASTER_ADDR`, default 127.0.0.1).
    pub master_addr: String,
    /// `MASTER_PORT`, default 29500 as torchrun's.
    pub master_port: u16,
    pub launcher: Launcher,
}

impl LaunchEnv {
    /// Reads the process environment.
    pub fn from_env() -> Result<LaunchEnv> {
        LaunchEnv::from_vars(|k| std::env::var(k).ok())
    }

    /// Reads variables through `get` (tests pass a map).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<LaunchEnv> {
        let num = |k: &str| -> Result<Option<usize>> {
            match get(k) {
                None => Ok(None),
                Some(v) => v.trim().parse::<usize>().map(Some).map_err(|_| CommError::BadVariable {
                    var: k.to_string(),
                    value: v.clone(),
                    expected: "a non-negative integer",
                }),
            }
        };
        let need = |k: &'static str, launcher: &'static str| -> Result<usize> {
            num(k)?.ok_or(CommError::MissingVariable { var: k, launcher })
        };
        let (launcher, rank, world, local_rank, local_world) = if num("RANK")?.is_some() {
            let world = need("WORLD_SIZE", "torchrun-style")?;
            (Launcher::Torchrun, need("RANK", "")?, world, num("LOCAL_RANK")?, num("LOCAL_WORLD_SIZE")?)
        } else if num("OMPI_COMM_WORLD_RANK")?.is_some() {
            (
                Launcher::OpenMpi,
                need("OMPI_COMM_WORLD_RANK", "")?,
                need("OMPI_COMM_WORLD_SIZE", "mpirun")?,
                num("OMPI_COMM_WORLD_LOCAL_RANK")?,
                num("OMPI_COMM_WORLD_LOCAL_SIZE")?,
            )
        } else if num("SLURM_PROCID")?.is_some() {
            // SLURM_NTASKS_PER_NODE is only set with --ntasks-per-node; SLURM_STEP_TASKS_PER_NODE
            // looks like "4(x2)" or "4,3": the first figure is this kind of node's count only
            // when all nodes are alike, which is the case this reads.
            let per_node = num("SLURM_NTASKS_PER_NODE")?.or_else(|| {
                get("SLURM_STEP_TASKS_PER_NODE").and_then(|v| {
                    let first: String = v.chars().take_while(char::is_ascii_digit).collect();
                    let uniform = !v.contains(',');
                    if uniform {
                        first.parse().ok()
                    } else {
                        None
                    }
                })
            });
            (
                Launcher::Slurm,
                need("SLURM_PROCID", "")?,
                need("SLURM_NTASKS", "srun")?,
                num("SLURM_LOCALID")?,
                per_node,
            )
        } else {
            (Launcher::Single, 0, 1, Some(0), Some(1))
        };
        if world == 0 || rank >= world {
            return Err(CommError::RankOutOfRange {
                what: "rank",
                rank,
                what_world: "world size",
                world,
                detail: format!(" ({launcher:?} variables)"),
            });
        }
        // Without local variables assume one node: the common single-host case.
        let local_rank = local_rank.unwrap_or(rank);
        let local_world = local_world.unwrap_or(world);
        if local_rank >= local_world {
            return Err(CommError::RankOutOfRange {
                what: "local rank",
                rank: local_rank,
                what_world: "local world size",
                world: local_world,
                detail: String::new(),
            });
        }
        let master_addr = get("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into());
        let master_port = match get("MASTER_PORT") {
            None => 29500,
            Some(p) => p.trim().parse().map_err(|_| CommError::BadVariable {
                var: "MASTER_PORT".into(),
                value: p.clone(),
                expected: "a port number",
            })?,
        };
        Ok(LaunchEnv {
            rank,
            world_size: world,
            local_rank,
            local_world_size: local_world,
            master_addr,
            master_port,
            launcher,
        })
    }

    /// Whether every rank runs on this host.
    pub fn single_node(&self) -> bool {
        self.local_world_size == self.world_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> Result<LaunchEnv> {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        LaunchEnv::from_vars(|k| m.get(k).cloned())
    }

    #[test]
    fn torchrun_variables() {
        let e = env(&[
            ("RANK", "5"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "4"),
            ("MASTER_ADDR", "node0"),
            ("MASTER_PORT", "1234"),
        ])
        .unwrap();
        assert_eq!((e.rank, e.world_size, e.local_rank, e.local_world_size), (5, 8, 1, 4));
        assert_eq!((e.master_addr.as_str(), e.master_port, e.launcher), ("node0", 1234, Launcher::Torchrun));
        assert!(!e.single_node());
    }

    #[test]
    fn open_mpi_and_slurm_variables() {
        let e = env(&[
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "3"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "2"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "3"),
        ])
        .unwrap();
        assert_eq!((e.rank, e.world_size, e.local_rank, e.launcher), (2, 3, 2, Launcher::OpenMpi));
        assert!(e.single_node());
        let e = env(&[
            ("SLURM_PROCID", "6"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "2"),
            ("SLURM_STEP_TASKS_PER_NODE", "4(x2)"),
        ])
        .unwrap();
        assert_eq!(
            (e.rank, e.world_size, e.local_rank, e.local_world_size, e.launcher),
            (6, 8, 2, 4, Launcher::Slurm)
        );
        assert_eq!(e.master_port, 29500);
    }

    #[test]
    fn bad_variables_are_errors_naming_them() {
        let err = env(&[("RANK", "x"), ("WORLD_SIZE", "2")]).unwrap_err().to_string();
        assert!(err.contains("RANK"), "{err}");
        let err = env(&[("RANK", "2"), ("WORLD_SIZE", "2")]).unwrap_err().to_string();
        assert!(err.contains("world size 2"), "{err}");
        assert_eq!(env(&[]).unwrap().launcher, Launcher::Single);
    }
}
