//! `cargo run --release -p vela-server --example serve -- --model PATH --port 8080`: the server
//! without the CLI (the same `ServeArgs` as `vela serve`).

use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    serve: vela_server::ServeArgs,
}

fn main() -> anyhow::Result<()> {
    vela_server::serve(Cli::parse().serve)
}
