use super::*;
use crate::transforms::{ChannelLayout, PixelOutput};

pub(crate) fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("oxtrain-if-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn touch(p: &Path) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, b"x").unwrap();
}

#[test]
fn classes_and_samples_in_torchvisions_order() {
    let d = tmp("order");
    for f in [
        "b/2.JPEG",
        "b/10.jpg",
        "b/sub/0.png",
        "b/a.txt",
        "B/x.Png",
        "a/z.ppm",
        "a/y.pgm",
        "a/w.webp",
        "a/v.TIFF",
        "b/sub2/1.jpeg",
        "b/Sub/3.bmp",
    ] {
        touch(&d.join(f));
    }
    std::fs::write(d.join("not_a_class.jpg"), b"x").unwrap();
    let (classes, idx) = find_classes(&d).unwrap();
    assert_eq!(classes, vec!["B", "a", "b"]);
    let samples = make_dataset(&d, &idx, &IMG_EXTENSIONS).unwrap();
    let rel: Vec<(String, usize)> = samples
        .iter()
        .map(|(p, c)| (p.strip_prefix(&d).unwrap().to_string_lossy().into_owned(), *c))
        .collect();
    let want = [
        ("B/x.Png", 0),
        ("a/y.pgm", 1),
        ("a/z.ppm", 1),
        ("b/10.jpg", 2),
        ("b/2.JPEG", 2),
        ("b/Sub/3.bmp", 2),
        ("b/sub/0.png", 2),
        ("b/sub2/1.jpeg", 2),
    ];
    assert_eq!(rel, want.iter().map(|(p, c)| (p.to_string(), *c)).collect::<Vec<_>>());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn empty_class_or_root_is_an_error() {
    let d = tmp("empty");
    assert!(find_classes(&d).unwrap_err().to_string().contains("no class folders"));
    touch(&d.join("a/1.jpg"));
    std::fs::create_dir_all(d.join("b")).unwrap();
    touch(&d.join("b/readme.txt"));
    let err = ImageFolder::new(&d, crate::ImageTransform::imagenet_eval(8, 8)).unwrap_err().to_string();
    assert!(err.contains("no valid file for the classes b"), "{err}");
    assert!(ImageFolder::new(d.join("missing"), crate::ImageTransform::imagenet_eval(8, 8)).is_err());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn imagenet_layout_loads_synthetic_shapes() {
    let d = tmp("imagenet");
    let names = crate::synthetic::write_shapes_image_folder(d.join("train"), 3, 4, 40, 1).unwrap();
    crate::synthetic::write_shapes_image_folder(d.join("val"), 3, 2, 40, 2).unwrap();
    let t = crate::ImageTransform::imagenet_train(32)
        .with_pixels(PixelOutput::U8)
        .with_layout(ChannelLayout::Hwc);
    let train = ImageFolder::imagenet(&d, "train", t).unwrap();
    let val = ImageFolder::imagenet(&d, "val", crate::ImageTransform::imagenet_eval(36, 32)).unwrap();
    assert_eq!(train.classes, names);
    assert_eq!((train.len(), val.len()), (12, 6));
    assert!(train.samples.iter().any(|(p, _)| p.extension().unwrap() == "png"));
    let mut out = vec![0u8; train.sample().bytes()];
    for i in 0..train.len() {
        let label = train.load_into(i, &mut SampleRng::new(0, 0, i as u64), &mut out).unwrap();
        assert_eq!(label as usize, train.samples[i].1);
    }
    std::fs::remove_dir_all(&d).unwrap();
}
