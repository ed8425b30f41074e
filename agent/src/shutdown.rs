//! Clean shutdown: SIGTERM or SIGINT resolves one future; the tasks select
//! on a watch channel and finish what they are doing (a purge job in
//! progress completes and is acknowledged, or stays in the processing list
//! to be run again at the next start).

use tokio::sync::watch;

/// Resolves on the first SIGTERM or SIGINT.
///
/// # Panics
/// When the signal handlers cannot be installed (no runtime).
pub async fn signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("install SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// A shutdown notice shared by every task.
#[derive(Clone)]
pub struct Shutdown {
    rx: watch::Receiver<bool>,
}

/// The sending side: [`Trigger::fire`] stops every [`Shutdown`].
pub struct Trigger {
    tx: watch::Sender<bool>,
}

#[must_use]
pub fn channel() -> (Trigger, Shutdown) {
    let (tx, rx) = watch::channel(false);
    (Trigger { tx }, Shutdown { rx })
}

impl Trigger {
    pub fn fire(&self) {
        let _ = self.tx.send(true);
    }
}

impl Shutdown {
    /// Resolves once shutdown has been fired (at once if it already was).
    pub async fn wait(&mut self) {
        let _ = self.rx.wait_for(|stop| *stop).await;
    }

    #[must_use]
    pub fn is_fired(&self) -> bool {
        *self.rx.borrow()
    }
}
