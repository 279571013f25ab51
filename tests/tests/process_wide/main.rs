//! What is set once per process: the default handle (`install`) and the kill switch
//! (`IDEMPOTENT_DISABLED`, read once, tested in a child process). Kept out of the other binaries so
//! that neither reaches their tests.

mod default_handle;
mod kill_switch;
