//! TLS to Postgres, under Supabase's names: `DB_SSL=true` makes every connection of the
//! sidecar (drain, checks, history, relay, presence) require TLS, and the server's
//! certificate is verified, chain and host name, against `DB_SSL_CA_CERT` (a PEM file of one
//! or more CA certificates) or, without it, the system's trust store (`/etc/ssl/certs`).
//! Supabase verifies against `DB_SSL_CA_CERT` when it is given and does not verify at all
//! without it; here there is no unverified TLS, since a connection that anyone on the path
//! can answer would hand them the sidecar's login. A `DATABASE_URL` may ask for TLS itself
//! (`sslmode=require`): it is verified the same way.
//!
//! Connections always go through the rustls connector (one `Connection` type for every
//! call site); without `DB_SSL` and without an `sslmode` asking for it, tokio-postgres never
//! starts TLS.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use tokio_postgres_rustls::MakeRustlsConnect;

/// What every connection of the sidecar connects with.
pub type Tls = MakeRustlsConnect;

/// The connector for the CA file `ca` (None: the system's trust store), built at its first
/// use (the startup check) and shared after: built at every (re)connection of each of the
/// sidecar's connections, it read the file, or the whole system store, again each time. A
/// CA file replaced on disk is read at the next start, as most clients read theirs.
pub fn shared(ca: Option<&std::path::Path>) -> Result<Tls, String> {
    type Built = std::collections::HashMap<Option<std::path::PathBuf>, Tls>;
    static BUILT: std::sync::LazyLock<std::sync::Mutex<Built>> =
        std::sync::LazyLock::new(Default::default);
    let key = ca.map(std::path::Path::to_path_buf);
    let mut built = BUILT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(tls) = built.get(&key) {
        return Ok(tls.clone());
    }
    let tls = connector(ca)?;
    built.insert(key, tls.clone());
    Ok(tls)
}

/// The connector for the CA file `ca` (None: the system's trust store), its roots read now.
/// Err names what is wrong with the file.
fn connector(ca: Option<&std::path::Path>) -> Result<Tls, String> {
    let mut roots = rustls::RootCertStore::empty();
    match ca {
        Some(path) => {
            let bad = |e: &dyn std::fmt::Display| format!("DB_SSL_CA_CERT {}: {e}", path.display());
            let certs: Vec<CertificateDer> = CertificateDer::pem_file_iter(path)
                .and_then(|certs| certs.collect::<Result<_, _>>())
                .map_err(|e| bad(&e))?;
            if certs.is_empty() {
                return Err(bad(&"it holds no certificate"));
            }
            for c in certs {
                roots.add(c).map_err(|e| bad(&e))?;
            }
        }
        None => {
            // Certificates the system's store holds but rustls cannot read are skipped, as
            // other clients skip them.
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
        }
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS to Postgres: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}
