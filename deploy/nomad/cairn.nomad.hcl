# Cairn workers on Nomad: one group per database, two allocations each, spread over zones (one owns
# the database, the other waits in standby and takes over when the owner's lease ends). Nomad
# restarts a task on any exit; that is safe: a restarted worker never takes a database from a live
# owner. Add a group per database (N workers for M databases). Configuration is environment
# variables only (every `cairn serve` flag has a CAIRN_* variable). Its syntax is parsed in CI by
# test/deploy/deploy.test.ts; `nomad job validate` could not be run there (no nomad binary).
#
# Safe as shipped: the task runs as uid 10001 with no capabilities, no-new-privileges and a
# read-only root file system (its data and work dirs are in the task's own local/ directory, /tmp is
# a tmpfs); it reaches etcd over TLS with a client certificate and its own etcd user; /metrics answers
# only with the token (CAIRN_TOKEN_FILE). Secrets come from the Nomad Variable nomad/jobs/cairn:
# anthropic_api_key, etcd_ca, etcd_cert, etcd_key (PEM), etcd_user_harness_1,
# etcd_password_harness_1 and ui_token (at least 16 characters).
#
# The cell sandbox (bubblewrap) needs unprivileged user namespaces: seccomp=unconfined below. It also
# mounts a fresh /proc, which the kernel refuses under Docker's masked /proc paths; we know of no
# Docker driver setting that unmasks them (not verified: deploy/README.md says what was).
job "cairn" {
  datacenters = ["dc1"]
  type        = "service"

  group "harness-1" {
    count = 2

    spread {
      attribute = "${meta.zone}"
      weight    = 100
    }

    restart {
      attempts = 10
      interval = "5m"
      delay    = "2s"
      mode     = "delay"
    }

    network {
      port "metrics" {
        to = 9464
      }
    }

    service {
      name     = "cairn-harness-1"
      port     = "metrics"
      provider = "nomad"
      tags     = ["cairn", "db=harness-1"]

      # /readyz answers any Host without the token: the check needs neither.
      check {
        name     = "ready"
        type     = "http"
        path     = "/readyz"
        interval = "10s"
        timeout  = "2s"
      }
    }

    task "serve" {
      driver       = "docker"
      kill_timeout = "60s"
      kill_signal  = "SIGTERM"
      user         = "10001:10001"

      config {
        image           = "cairn:latest"
        args            = ["serve"]
        ports           = ["metrics"]
        readonly_rootfs = true
        cap_drop        = ["all"]
        security_opt    = ["no-new-privileges", "seccomp=unconfined"]

        mount {
          type     = "tmpfs"
          target   = "/tmp"
          readonly = false
          tmpfs_options {
            size = 1073741824
          }
        }
      }

      env {
        CAIRN_DB             = "harness-1"
        CAIRN_STORAGE        = "replicated"
        CAIRN_ETCD_ENDPOINTS = "https://etcd-a.service:2379,https://etcd-b.service:2379,https://etcd-c.service:2379"
        CAIRN_ETCD_CA        = "/secrets/etcd-ca.crt"
        CAIRN_ETCD_CERT      = "/secrets/etcd-client.crt"
        CAIRN_ETCD_KEY       = "/secrets/etcd-client.key"
        CAIRN_MODEL          = "anthropic/claude-sonnet-4-5"
        CAIRN_LISTEN         = "0.0.0.0:9464"
        CAIRN_LEASE          = "10s"
        CAIRN_DATA_DIR       = "/local/cairn"
        CAIRN_CWD            = "/local/work"
        CAIRN_TOKEN_FILE     = "/secrets/ui-token"
        # Scrapers reach the task at the host's address and the mapped port: that Host is served too.
        CAIRN_ALLOW_HOST = "${NOMAD_HOST_ADDR_metrics}"
        HOME             = "/local/home"
      }

      template {
        data        = <<-EOT
          ANTHROPIC_API_KEY={{ with nomadVar "nomad/jobs/cairn" }}{{ .anthropic_api_key }}{{ end }}
          CAIRN_ETCD_USER={{ with nomadVar "nomad/jobs/cairn" }}{{ .etcd_user_harness_1 }}{{ end }}
          CAIRN_ETCD_PASSWORD={{ with nomadVar "nomad/jobs/cairn" }}{{ .etcd_password_harness_1 }}{{ end }}
        EOT
        destination = "secrets/cairn.env"
        env         = true
        perms       = "0400"
        uid         = 10001
        gid         = 10001
      }

      template {
        data        = "{{ with nomadVar \"nomad/jobs/cairn\" }}{{ .ui_token }}{{ end }}"
        destination = "secrets/ui-token"
        perms       = "0400"
        uid         = 10001
        gid         = 10001
      }

      template {
        data        = "{{ with nomadVar \"nomad/jobs/cairn\" }}{{ .etcd_ca }}{{ end }}"
        destination = "secrets/etcd-ca.crt"
        perms       = "0444"
      }

      template {
        data        = "{{ with nomadVar \"nomad/jobs/cairn\" }}{{ .etcd_cert }}{{ end }}"
        destination = "secrets/etcd-client.crt"
        perms       = "0444"
      }

      template {
        data        = "{{ with nomadVar \"nomad/jobs/cairn\" }}{{ .etcd_key }}{{ end }}"
        destination = "secrets/etcd-client.key"
        perms       = "0400"
        uid         = 10001
        gid         = 10001
      }

      resources {
        cpu    = 200
        memory = 512
      }
    }
  }
}
