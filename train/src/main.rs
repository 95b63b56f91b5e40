//! The `oxtrain` command.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        None | Some("train") => {
            eprintln!(
                "oxtrain train: not yet. The trainer arrives with the autograd and nn crates; \
                 today oxtrain is a tensor library (see README.md)."
            );
            std::process::exit(2);
        }
        Some("--version") => println!("oxtrain {}", env!("CARGO_PKG_VERSION")),
        Some(other) => {
            eprintln!("oxtrain: unknown command `{other}`; try `oxtrain train`");
            std::process::exit(2);
        }
    }
}
