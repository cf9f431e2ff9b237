package emulator

import dto "github.com/prometheus/client_model/go"

type dtoFamily = dto.MetricFamily
