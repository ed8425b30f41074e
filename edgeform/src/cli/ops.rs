//! `completions`: the shell completion scripts of the command line.

/// `edgeform completions <shell>`: the completion script on stdout.
pub fn completions(shell: clap_complete::Shell) -> u8 {
    use clap::CommandFactory;
    let mut cmd = super::Cli::command();
    clap_complete::generate(shell, &mut cmd, "edgeform", &mut std::io::stdout());
    0
}
