//! The built-in tools' settings: one typed struct with defaults and validation, and the
//! command-line flags (each mirroring an environment variable) that fill it. The binaries
//! that run tools flatten [`ToolArgs`] beside the relay's flags.

use std::time::Duration;

use clap::Args;

use crate::mip::MipConfig;
use crate::mip::sandbox::SandboxConfig;
use crate::plantuml;

/// `PLANTUML_SERVER_URL`: the PlantUML server `encodePlantUML`'s URLs point at.
pub const ENV_PLANTUML_SERVER: &str = "PLANTUML_SERVER_URL";
/// `MIP_PYTHON`: the Python (a virtualenv with PuLP 3) the MIP sandbox runs.
pub const ENV_MIP_PYTHON: &str = "MIP_PYTHON";
/// `REMIP_URL`: a ReMIP server to solve MIPs with instead of HiGHS.
pub const ENV_REMIP_URL: &str = "REMIP_URL";
/// `MIP_MAX_CONCURRENT`: sandbox runs and solves at once.
pub const ENV_MIP_MAX_CONCURRENT: &str = "MIP_MAX_CONCURRENT";
/// `MIP_QUEUE_WAIT_SECONDS`: how long a MIP call waits for its turn when every slot is taken.
pub const ENV_MIP_QUEUE_WAIT: &str = "MIP_QUEUE_WAIT_SECONDS";

/// Settings of the built-in tools.
#[derive(Debug, Clone)]
pub struct BuiltinConfig {
    /// PlantUML server the encoder's URLs point at (`PLANTUML_SERVER_URL`).
    pub plantuml_server: String,
    /// The MIP tools' sandbox and solver.
    pub mip: MipConfig,
}

impl Default for BuiltinConfig {
    fn default() -> Self {
        Self {
            plantuml_server: plantuml::DEFAULT_SERVER.to_owned(),
            mip: MipConfig::default(),
        }
    }
}

impl BuiltinConfig {
    /// Checks the settings; the message names the variable to fix.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(url) = &self.mip.remip_url
            && !url.starts_with("http://")
        {
            return Err(format!(
                "{ENV_REMIP_URL} ({url}) must be an http:// URL (the ReMIP client speaks plain HTTP, e.g. inside the cluster)"
            ));
        }
        let server = &self.plantuml_server;
        if !(server.starts_with("http://") || server.starts_with("https://")) {
            return Err(format!(
                "{ENV_PLANTUML_SERVER} ({server}) must be an http:// or https:// URL"
            ));
        }
        Ok(())
    }
}

/// The built-in tools' command-line flags; each has an environment variable of the same
/// meaning.
#[derive(Debug, Clone, Args)]
pub struct ToolArgs {
    /// PlantUML server the URLs of encodePlantUML point at.
    #[arg(long, env = ENV_PLANTUML_SERVER, default_value = plantuml::DEFAULT_SERVER)]
    pub plantuml_server_url: String,
    /// Python of the virtualenv (with PuLP 3) that the MIP sandbox runs.
    #[arg(long, env = ENV_MIP_PYTHON, default_value = "/opt/toolrelay/mip-venv/bin/python")]
    pub mip_python: std::path::PathBuf,
    /// A ReMIP server (http://host:port) to solve with instead of HiGHS.
    #[arg(long, env = ENV_REMIP_URL)]
    pub remip_url: Option<String>,
    /// Sandbox runs and solves at once.
    #[arg(long, env = ENV_MIP_MAX_CONCURRENT, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub mip_max_concurrent: u64,
    /// Seconds a MIP call waits for its turn when every slot is taken (then 429 BUSY).
    #[arg(long, env = ENV_MIP_QUEUE_WAIT, default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=600))]
    pub mip_queue_wait_seconds: u64,
}

impl ToolArgs {
    /// The settings these flags describe, validated.
    pub fn builtin_config(&self) -> Result<BuiltinConfig, String> {
        let config = BuiltinConfig {
            plantuml_server: self.plantuml_server_url.clone(),
            mip: MipConfig {
                sandbox: SandboxConfig {
                    python: self.mip_python.clone(),
                    ..SandboxConfig::default()
                },
                remip_url: self.remip_url.clone(),
                max_concurrent: usize::try_from(self.mip_max_concurrent).unwrap_or(2),
                queue_wait: Duration::from_secs(self.mip_queue_wait_seconds),
            },
        };
        config.validate()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        tools: ToolArgs,
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let config = Cli::try_parse_from(["relay"])
            .unwrap()
            .tools
            .builtin_config()
            .unwrap();
        assert_eq!(config.plantuml_server, plantuml::DEFAULT_SERVER);
        assert_eq!(config.mip.remip_url, None);
        assert_eq!(config.mip.max_concurrent, 2);
        assert_eq!(config.mip.queue_wait, Duration::from_secs(10));
    }

    #[test]
    fn bad_urls_name_the_variable() {
        let cli = Cli::try_parse_from(["relay", "--remip-url", "https://remip:8000"]).unwrap();
        let message = cli.tools.builtin_config().unwrap_err();
        assert!(message.contains(ENV_REMIP_URL), "{message}");
        let cli = Cli::try_parse_from(["relay", "--plantuml-server-url", "plantuml"]).unwrap();
        let message = cli.tools.builtin_config().unwrap_err();
        assert!(message.contains(ENV_PLANTUML_SERVER), "{message}");
        assert!(Cli::try_parse_from(["relay", "--mip-max-concurrent", "0"]).is_err());
    }
}
