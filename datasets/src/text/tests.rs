use super::*;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("oxtrain-text-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn lm_blocks_pack_documents_and_shift_by_one() {
    let d = tmp("lm");
    std::fs::write(d.join("a.txt"), "hello").unwrap();
    std::fs::write(d.join("b.jsonl"), "{\"text\": \"ab\"}\n\n{\"text\": \"xyz\"}\n").unwrap();
    let ds = LmDataset::from_files(&[d.join("a.txt"), d.join("b.jsonl")], &ByteTokenizer, 4).unwrap();
    // h e l l o EOS a b EOS x y z EOS: 13 tokens, blocks of 5 overlapping by one -> 3 blocks.
    let expected: Vec<u32> = "hello"
        .bytes()
        .map(u32::from)
        .chain([256])
        .chain("ab".bytes().map(u32::from))
        .chain([256])
        .chain("xyz".bytes().map(u32::from))
        .chain([256])
        .collect();
    assert_eq!(ds.num_tokens(), expected.len());
    assert_eq!(ds.len(), 3);
    for i in 0..3 {
        let (x, y) = ds.get(i);
        let want: Vec<i64> = expected[i * 4..i * 4 + 5].iter().map(|&v| v as i64).collect();
        assert_eq!(x, want[..4].to_vec());
        assert_eq!(y, want[1..].to_vec());
    }
    let (x, y) = ds.batch(&[2, 0]).unwrap();
    assert_eq!(x.dims(), &[2, 4]);
    assert_eq!(y.to_vec::<i64>()[..4], ds.get(2).1[..]);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn lm_errors_name_the_line() {
    let d = tmp("lmerr");
    std::fs::write(d.join("bad.jsonl"), "{\"text\": \"ok\"}\n{\"txt\": 1}\n").unwrap();
    let err = LmDataset::from_files(&[d.join("bad.jsonl")], &ByteTokenizer, 4).unwrap_err().to_string();
    assert!(err.contains("bad.jsonl:2") && err.contains("text"), "{err}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn classification_labels_and_padding() {
    let d = tmp("cls");
    std::fs::write(d.join("s.jsonl"), "{\"text\": \"good\", \"label\": \"pos\"}\n{\"text\": \"bad!\", \"label\": \"neg\"}\n{\"text\": \"meh\", \"label\": \"pos\"}\n").unwrap();
    let ds = TextClassificationDataset::from_jsonl(d.join("s.jsonl")).unwrap();
    assert_eq!(ds.label_names.as_deref(), Some(&["neg".to_string(), "pos".to_string()][..]));
    assert_eq!(ds.labels, vec![1, 0, 1]);
    let (ids, mask, labels) = ds.batch(&[2, 1], &ByteTokenizer, 3, 0).unwrap();
    assert_eq!(
        ids.to_vec::<i64>(),
        vec![b'm' as i64, b'e' as i64, b'h' as i64, b'b' as i64, b'a' as i64, b'd' as i64]
    );
    assert_eq!(mask.to_vec::<i64>(), vec![1; 6]);
    assert_eq!(labels.to_vec::<i64>(), vec![1, 0]);
    let (ids, mask, _) = ds.batch(&[0, 2], &ByteTokenizer, 10, 999).unwrap();
    assert_eq!(ids.dims(), &[2, 4]);
    assert_eq!(ids.to_vec::<i64>()[7], 999);
    assert_eq!(mask.to_vec::<i64>(), vec![1, 1, 1, 1, 1, 1, 1, 0]);
    std::fs::write(d.join("n.jsonl"), "{\"text\": \"a\", \"label\": 3}\n{\"text\": \"b\", \"label\": 0}\n")
        .unwrap();
    assert_eq!(TextClassificationDataset::from_jsonl(d.join("n.jsonl")).unwrap().labels, vec![3, 0]);
    std::fs::write(
        d.join("m.jsonl"),
        "{\"text\": \"a\", \"label\": 3}\n{\"text\": \"b\", \"label\": \"x\"}\n",
    )
    .unwrap();
    assert!(TextClassificationDataset::from_jsonl(d.join("m.jsonl")).is_err());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn fn_tokenizer_plugs_in() {
    let words = FnTokenizer {
        encode: |s: &str| s.split_whitespace().map(|w| w.len() as u32).collect(),
        eos_token_id: Some(0),
        vocab_size: 100,
    };
    let ds = LmDataset::from_files(&[], &words, 2).unwrap();
    assert!(ds.is_empty());
    assert_eq!(words.encode("a bb ccc"), vec![1, 2, 3]);
}

#[test]
fn lm_block_size_zero_is_an_error() {
    let d = tmp("lm0");
    std::fs::write(d.join("a.txt"), "hello").unwrap();
    let err = LmDataset::from_files(&[d.join("a.txt")], &ByteTokenizer, 0).unwrap_err();
    assert!(matches!(err, Error::Config(_)) && err.to_string().contains("block_size is 0"), "{err}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn classification_lines_without_a_usable_label_name_the_line() {
    let d = tmp("cls_bad");
    let cases = [
        ("{\"text\": \"ok\", \"label\": 1}\n{\"text\": \"no label here\"}\n", ":2", "no field \"label\""),
        ("{\"text\": \"ok\", \"label\": [1]}\n", ":1", "neither an integer nor a string"),
        (
            "{\"text\": \"a\", \"label\": 1}\n{\"text\": \"b\", \"label\": \"pos\"}\n",
            "",
            "mix integers and strings",
        ),
        ("{\"label\": 0}\n", ":1", "text"),
        ("{\"text\": \"a\", \"label\": 0\n", ":1", "not JSON"),
    ];
    for (i, (body, line, reason)) in cases.iter().enumerate() {
        let path = d.join(format!("bad{i}.jsonl"));
        std::fs::write(&path, body).unwrap();
        let err = TextClassificationDataset::from_jsonl(&path).unwrap_err().to_string();
        assert!(err.contains(&format!("bad{i}.jsonl{line}")) && err.contains(reason), "case {i}: {err}");
    }
    std::fs::remove_dir_all(&d).unwrap();
}
