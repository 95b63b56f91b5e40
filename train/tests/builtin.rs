//! The built-in example learns: at least 97% held-out accuracy on the CPU, in f32 and with
//! bf16 autocast (f32 master weights), from data the example draws itself.

use oxtrain::builtin::{self, Options, Precision};

fn train(precision: Precision) -> builtin::Report {
    let opts = Options { precision, progress: false, ..Options::default() };
    builtin::run(&opts).expect("the example runs on the CPU")
}

#[test]
fn the_cnn_reaches_97_percent_in_f32() {
    let r = train(Precision::F32);
    assert!(
        r.test_accuracy >= 0.97,
        "f32: test accuracy {:.4}, final loss {:.4}",
        r.test_accuracy,
        r.final_loss
    );
}

#[test]
fn the_cnn_reaches_97_percent_with_bf16_autocast() {
    let r = train(Precision::Bf16);
    assert!(
        r.test_accuracy >= 0.97,
        "bf16: test accuracy {:.4}, final loss {:.4}",
        r.test_accuracy,
        r.final_loss
    );
}

#[test]
fn an_untrained_cnn_is_near_chance() {
    // The check above could only pass by learning: before training the accuracy is ~25%.
    oxtrain_tensor::manual_seed(0);
    let net = builtin::model(oxtrain_tensor::Device::Cpu).unwrap();
    let test = builtin::shapes::make(1024, 16, 1, oxtrain_tensor::Device::Cpu).unwrap();
    let acc = builtin::accuracy(&net, &test, Precision::F32);
    assert!(acc < 0.5, "untrained accuracy {acc}");
}
