# Cairn workers on Nomad: one group per database, two allocations each, spread over zones (one owns
# the database, the other waits in standby and takes over when the owner's lease ends). Nomad
# restarts a task on any exit; that is safe: a restarted worker never takes a database from a live
# owner. Add a group per database (N workers for M databases). Configuration is environment
# variables only (every `cairn serve` flag has a CAIRN_* variable). Its syntax is parsed in CI by
# test/deploy/deploy.test.ts; `nomad job validate` could not be run there (no nomad binary).
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

      config {
        image = "cairn:latest"
        args  = ["serve"]
        ports = ["metrics"]
      }

      env {
        CAIRN_DB             = "harness-1"
        CAIRN_STORAGE        = "replicated"
        CAIRN_ETCD_ENDPOINTS = "http://etcd-a.service:2379,http://etcd-b.service:2379,http://etcd-c.service:2379"
        CAIRN_MODEL          = "anthropic/claude-sonnet-4-5"
        CAIRN_LISTEN         = "0.0.0.0:9464"
        CAIRN_LEASE          = "10s"
        CAIRN_DATA_DIR       = "/local/cairn"
        CAIRN_CWD            = "/local/work"
      }

      template {
        data        = <<-EOT
          ANTHROPIC_API_KEY={{ with nomadVar "nomad/jobs/cairn" }}{{ .anthropic_api_key }}{{ end }}
        EOT
        destination = "secrets/model.env"
        env         = true
      }

      resources {
        cpu    = 200
        memory = 512
      }
    }
  }
}
