//! One test per kind of config error, each checking the message a user reads.

use super::*;

fn err(text: &str, overrides: &[&str]) -> String {
    match Config::from_toml_str(text, "run.toml", overrides) {
        Ok(c) => panic!("expected an error, got {c:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn defaults_are_valid_and_round_trip_through_print() {
    let c = Config::load::<&str>(None, &[]).unwrap();
    assert_eq!(c, Config::default());
    let printed = c.to_toml();
    assert!(printed.contains("[optim]") && printed.contains("batch_size = 64"), "{printed}");
    assert_eq!(Config::from_toml_str(&printed, "printed", &[] as &[&str]).unwrap(), c);
}

#[test]
fn unknown_key_names_key_section_and_nearest_valid_key() {
    let m = err("[train]\nepoch = 3\n", &[]);
    assert!(m.contains("unknown key `epoch` in section [train] (run.toml)"), "{m}");
    assert!(m.contains("did you mean `epochs`?"), "{m}");
    assert!(m.contains("the keys of [train] are: "), "{m}");
}

#[test]
fn a_key_of_another_section_says_where_it_belongs() {
    let m = err("[train]\nlr = 0.1\n", &[]);
    assert!(m.contains("did you mean `optim.lr (it belongs in [optim])`?"), "{m}");
}

#[test]
fn a_key_above_every_section_says_which_section_has_it() {
    let m = err("epochs = 1\n[train]\nseed = 1\n", &[]);
    assert!(!m.contains("unknown section"), "{m}");
    assert!(m.contains("`epochs` in run.toml is outside any section"), "{m}");
    assert!(m.contains("it belongs in [train]: move it under the [train] line"), "{m}");
    let m = err("dir = \"x\"\n", &[]);
    assert!(m.contains("it is a key of [checkpoint], [log]"), "{m}");
}

#[test]
fn class_names_take_a_list_of_strings() {
    let c = Config::from_toml_str("[data]\nclass_names = [\"cat\", \"dog\"]\n", "run.toml", &[] as &[&str])
        .unwrap();
    assert_eq!(c.data.class_names, ["cat", "dog"]);
    let m = err("[data]\nclass_names = \"cat\"\n", &[]);
    assert!(m.contains("must be a list of strings"), "{m}");
}

#[test]
fn unknown_section_suggests_the_nearest() {
    let m = err("[optimizer]\nlr = 0.1\n", &[]);
    assert!(m.contains("unknown section [optimizer]") && m.contains("did you mean [optim]?"), "{m}");
}

#[test]
fn wrong_type_says_what_is_expected() {
    let m = err("[train]\nepochs = \"ten\"\n", &[]);
    assert_eq!(m, "`train.epochs` (run.toml) must be a non-negative integer, not the string \"ten\"");
    let m = err("[optim]\nlr = true\n", &[]);
    assert!(m.contains("`optim.lr` (run.toml) must be a number, not the boolean true"), "{m}");
}

#[test]
fn unknown_model_lists_the_models_and_the_nearest() {
    let m = err("[model]\nname = \"resnet51\"\n", &[]);
    assert!(m.contains("`model.name` = \"resnet51\" is not allowed: use one of \"resnet18\""), "{m}");
    assert!(m.contains("\"bert\"") && m.contains("(did you mean \"resnet50\"?)"), "{m}");
    assert!(!m.contains("\"model.name\""), "the key is not among the allowed values: {m}");
}

#[test]
fn data_decode_takes_auto_cpu_or_gpu_and_gpu_only_for_images() {
    let m = err("", &["data.decode=gpux"]);
    assert_eq!(m, "`data.decode` = \"gpux\" is not allowed: use one of \"auto\", \"cpu\", \"gpu\" (did you mean \"gpu\"?)");
    let m = err("", &["data.decode=gpu", "data.kind=text_lm", "data.train=x.txt"]);
    assert!(m.contains("only images are decoded") && m.contains("\"auto\""), "{m}");
}

#[test]
fn chunked_loss_is_for_gpt2_only() {
    let m = err("", &["train.chunked_loss=true"]);
    assert_eq!(
        m,
        "`train.chunked_loss` = true is not allowed: the chunked loss is GPT-2's LM head and loss, and \
         model.name = \"resnet18\": set it to false"
    );
}

#[test]
fn impossible_values_say_what_is_allowed() {
    let m = err("", &["data.batch_size=0"]);
    assert_eq!(m, "`data.batch_size` = 0 is not allowed: a batch needs at least one sample: use 1 or more");
    let m = err("", &["train.epochs=0"]);
    assert!(m.contains("`train.epochs` = 0 is not allowed"), "{m}");
    for lr in ["-1", "nan", "1000", "inf", "0"] {
        let m = err("", &[&format!("optim.lr={lr}")]);
        assert!(
            m.contains("`optim.lr` = ") && m.contains("the learning rate must be a finite number in (0, 10]"),
            "{lr}: {m}"
        );
    }
    let m = err("", &["data.batch_size=-4"]);
    assert!(m.contains("`data.batch_size` = -4 is not allowed: it counts something"), "{m}");
}

#[test]
fn model_and_data_must_fit() {
    let m = err("[model]\nname = \"gpt2\"\n", &[]);
    assert!(m.contains("model.name = \"gpt2\" trains on data.kind = \"text_lm\""), "{m}");
}

#[test]
fn overrides_take_the_same_checks_and_negative_numbers() {
    let c = Config::from_toml_str(
        "[optim]\nlr = 0.1\n",
        "run.toml",
        &["optim.lr=2e-3", "epochs=3", "model.name=resnet50"],
    )
    .unwrap();
    assert_eq!((c.optim.lr, c.train.epochs, c.model.name), (2e-3, 3, ModelName::Resnet50));
    // A negative value where one makes sense: the transformer dropout's "keep the preset's".
    let c = Config::from_toml_str("[model]\ndropout = 0.1\n", "run.toml", &["model.dropout=-1"]).unwrap();
    assert_eq!(c.model.dropout, -1.0);
    let m = err("", &["train.epoch=3"]);
    assert!(m.contains("unknown key `epoch` in section [train] (the command line `train.epoch=3`)"), "{m}");
    assert!(m.contains("did you mean `epochs`?"), "{m}");
    let m = err("", &["epoch=3"]);
    assert!(m.contains("no section has a key `epoch`; did you mean `train.epochs`?"), "{m}");
    let m = err("", &["batch_size"]);
    assert!(m.contains("expected key=value"), "{m}");
    let m = err("", &["train.epochs=many"]);
    assert!(
        m.contains("`train.epochs` (the command line `train.epochs=many`) must be a non-negative integer"),
        "{m}"
    );
    // A string key takes the text as it is, even when it reads as a number.
    let c = Config::from_toml_str("", "x", &["log.dir=2024"]).unwrap();
    assert_eq!(c.log.dir, "2024");
}

#[test]
fn syntax_errors_name_the_file() {
    let m = err("[train\nepochs = 3\n", &[]);
    assert!(m.starts_with("run.toml is not valid TOML:"), "{m}");
}
