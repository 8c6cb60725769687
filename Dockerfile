# toolrelay's runtime image: the three release binaries (the CODAP plugin is built into them),
# the MIP sandbox's PuLP virtualenv, and bubblewrap, Python and util-linux from Debian. Nothing
# is compiled here: scripts/image.sh builds the binaries and the virtualenv on the host and
# hands them over as the build context (`scripts/image.sh --context-only` prints its path, for
# `docker build -f Dockerfile <that path>`).
FROM debian:bookworm-slim

# bubblewrap: the MIP sandbox; python3: the interpreter its virtualenv runs (the same Debian
# Python the virtualenv was made with); util-linux: prlimit and setpriv, which the relay
# starts every sandbox run under (part of the base already, named so it stays).
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        bubblewrap python3 util-linux \
    && rm -rf /var/lib/apt/lists/*

# The uid everything runs as unless told otherwise (the gateway always; the relay only
# without its MIP sandbox: README, "Container image").
RUN useradd --system --uid 10001 --user-group --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin toolrelay

# Read-only for every uid but world-readable: the sandbox runs it as uids of its own.
COPY mip-venv /opt/toolrelay/mip-venv
# The virtualenv was made with the host's Debian Python: fail here, not at the first run, if
# this Python cannot load it.
RUN /opt/toolrelay/mip-venv/bin/python -I -c 'import pulp'

COPY bin/toolrelay bin/toolrelay-relay bin/toolrelay-gateway /usr/local/bin/

# Every address on the container's network, on the default ports; every other setting is an
# environment variable too (README, "Configuration").
ENV LISTEN_ADDR=0.0.0.0:8080 \
    GRPC_LISTEN_ADDR=0.0.0.0:50051 \
    WS_LISTEN_ADDR=0.0.0.0:8081 \
    MIP_PYTHON=/opt/toolrelay/mip-venv/bin/python
# 8080: HTTP (gateway, or everything in one process); 8081: the relay's tab WebSocket and
# probes; 50051: the relay's gRPC.
EXPOSE 8080 8081 50051

USER 10001:10001
# The binaries drain on SIGTERM (DRAIN_SECONDS, 10 by default) and then exit: give them
# longer than that before SIGKILL (`podman stop -t 15`, terminationGracePeriodSeconds).
STOPSIGNAL SIGTERM
# One process by default; `toolrelay-relay` or `toolrelay-gateway` as the command splits it.
CMD ["toolrelay"]
