use super::*;
use crate::{Dataset, LmDataset, SampleRng};

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("oxtrain-shards-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Tokens 0, 1, 2, ... (wrapping at the format's width), cut into shards of `per_shard`.
fn write_stream(dir: &Path, n: usize, per_shard: usize, width: TokenWidth) -> (Vec<u32>, Vec<PathBuf>) {
    let tokens: Vec<u32> = (0..n as u32).map(|t| t * 7 % 65536).collect();
    let mut w = ShardWriter::new(dir, "t", per_shard, width, false).unwrap();
    // Pushed in uneven pieces: the cut does not depend on how the stream arrives.
    for piece in tokens.chunks(3) {
        w.push(piece).unwrap();
    }
    assert_eq!(w.tokens(), n);
    (tokens, w.finish().unwrap())
}

#[test]
fn shards_read_back_as_one_stream_across_their_boundaries() {
    for width in [TokenWidth::U16, TokenWidth::U32] {
        let d = tmp(&format!("stream-{width:?}"));
        let (tokens, paths) = write_stream(&d, 23, 5, width);
        let names: Vec<String> =
            paths.iter().map(|p| p.file_name().unwrap().to_string_lossy().into()).collect();
        assert_eq!(
            names,
            [
                "t_train_000000.bin",
                "t_train_000001.bin",
                "t_train_000002.bin",
                "t_train_000003.bin",
                "t_train_000004.bin"
            ]
        );
        let shards = TokenShards::from_spec(d.to_str().unwrap()).unwrap();
        assert_eq!(shards.len(), 23);
        assert_eq!(shards.shards().iter().map(TokenShard::len).collect::<Vec<_>>(), [5, 5, 5, 5, 3]);
        for start in 0..23 {
            for len in 0..=23 - start {
                let mut out = vec![-1i64; len];
                shards.read_into(start, &mut out);
                let want: Vec<i64> = tokens[start..start + len].iter().map(|&t| t as i64).collect();
                assert_eq!(out, want, "{width:?} tokens {start}..{}", start + len);
            }
        }
        assert_eq!(shards.max_token(), *tokens.iter().max().unwrap());
        std::fs::remove_dir_all(&d).unwrap();
    }
}

/// The language-model dataset of shards gives the blocks it gives for the same tokens in
/// memory, through `get` and through the loader's `load_into`.
#[test]
fn lm_blocks_from_shards_equal_those_from_tokens() {
    let d = tmp("lm");
    let (tokens, paths) = write_stream(&d, 41, 7, TokenWidth::U16);
    let from_shards = LmDataset::from_shards(TokenShards::open(&paths).unwrap(), 4).unwrap();
    let in_memory = LmDataset::from_tokens(tokens, 4);
    assert_eq!((from_shards.len(), from_shards.num_tokens()), (10, 41));
    let mut rng = SampleRng::new(0, 0, 0);
    for i in 0..from_shards.len() {
        assert_eq!(from_shards.get(i), in_memory.get(i), "block {i}");
        let (mut a, mut b) = (vec![0u8; 40], vec![0u8; 40]);
        from_shards.load_into(i, &mut rng, &mut a).unwrap();
        in_memory.load_into(i, &mut rng, &mut b).unwrap();
        assert_eq!(a, b, "block {i} through load_into");
    }
    std::fs::remove_dir_all(&d).unwrap();
}

fn problem(path: &Path) -> ShardProblem {
    match TokenShard::open(path).unwrap_err() {
        Error::TokenShard { path: p, problem } => {
            assert_eq!(p, path);
            problem
        }
        other => panic!("not a TokenShard error: {other:?}"),
    }
}

#[test]
fn truncated_and_foreign_files_are_refused_naming_the_file() {
    let d = tmp("bad");
    let (_, paths) = write_stream(&d, 10, 10, TokenWidth::U16);
    let good = std::fs::read(&paths[0]).unwrap();
    let write = |name: &str, bytes: &[u8]| {
        let p = d.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    };

    let cut = write("cut.bin", &good[..good.len() - 1]);
    let err = TokenShard::open(&cut).unwrap_err().to_string();
    assert!(err.contains("cut.bin") && err.contains("oxtrain tokenize"), "{err}");
    assert!(matches!(problem(&cut), ShardProblem::Length { count: 10, expected: 1044, len: 1043 }));
    let longer = write("longer.bin", &[&good[..], &[0, 0]].concat());
    assert!(matches!(problem(&longer), ShardProblem::Length { len: 1046, .. }));
    let header_only = write("header.bin", &good[..100]);
    assert!(matches!(problem(&header_only), ShardProblem::ShortHeader { len: 100 }));

    let mut nanogpt = good.clone();
    nanogpt[..4].copy_from_slice(&1234i32.to_le_bytes());
    let p = write("magic.bin", &nanogpt);
    assert!(matches!(problem(&p), ShardProblem::Magic { found: 1234 }));
    assert!(TokenShard::open(&p).unwrap_err().to_string().contains("magic.bin"));

    let mut version = good.clone();
    version[4..8].copy_from_slice(&7i32.to_le_bytes());
    let p = write("version.bin", &version);
    assert!(matches!(problem(&p), ShardProblem::Version { found: 7, expected: 1, .. }));

    let mut negative = good;
    negative[8..12].copy_from_slice(&(-1i32).to_le_bytes());
    let p = write("negative.bin", &negative);
    assert!(matches!(problem(&p), ShardProblem::NegativeCount { count: -1 }));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn u16_shards_refuse_wide_tokens_and_patterns_must_match() {
    let d = tmp("wide");
    let mut w = ShardWriter::new(&d, "w", 4, TokenWidth::U16, true).unwrap();
    w.push(&[1, 2, 3, 4, 5]).unwrap();
    assert!(matches!(
        w.push(&[1, 2, 70000]),
        Err(Error::TokenShard { problem: ShardProblem::TokenTooWide { token: 70000 }, .. })
    ));
    assert_eq!(TokenWidth::for_vocab(65536), TokenWidth::U16);
    assert_eq!(TokenWidth::for_vocab(65537), TokenWidth::U32);

    // The first shard is the validation split, as llm.c names it.
    assert!(d.join("w_val_000000.bin").is_file());
    let spec = d.join("w_train_*.bin");
    let err = TokenShards::from_spec(spec.to_str().unwrap()).unwrap_err();
    assert!(matches!(err, Error::TokenShard { problem: ShardProblem::NoShards(_), .. }), "{err:?}");
    assert!(ShardWriter::new(&d, "w", 0, TokenWidth::U16, false).is_err());
    std::fs::remove_dir_all(&d).unwrap();
}
