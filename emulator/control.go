package emulator

import (
	"net/http"
	"strconv"
)

// ReplicaStatus is one replica in the control endpoint's listing.
type ReplicaStatus struct {
	Index   int    `json:"index"`
	URL     string `json:"url"`
	Engines int    `json:"engines"`
	Stopped bool   `json:"stopped"`
	Errors  bool   `json:"errors"`
	Hang    bool   `json:"metrics_hang"`
	// RequestsHang: generation requests are accepted and never answered.
	RequestsHang bool `json:"requests_hang"`
}

// Status lists the replicas and their faults.
func (s *Server) Status() []ReplicaStatus {
	out := make([]ReplicaStatus, len(s.replicas))
	for i, rep := range s.replicas {
		rep.mu.Lock()
		out[i] = ReplicaStatus{Index: i, URL: "http://" + rep.addr, Engines: len(rep.runners),
			Stopped: rep.stopped, Errors: rep.errors.Load(), Hang: rep.hang != nil, RequestsHang: rep.reqHang != nil}
		rep.mu.Unlock()
	}
	return out
}

// ControlHandler serves fault controls, for a separate listener:
//
//	GET  /replicas                            → []ReplicaStatus
//	POST /replicas/{i}/stop | /restart
//	POST /replicas/{i}/errors?on=true|false
//	POST /replicas/{i}/metrics-hang?on=true|false
//	POST /replicas/{i}/requests-hang?on=true|false  (accept, never answer)
//	POST /engines/{i}/slow?factor=F           (1 = normal)
func (s *Server) ControlHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /replicas", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.Status())
	})
	mux.HandleFunc("POST /replicas/{i}/{action}", func(w http.ResponseWriter, r *http.Request) {
		i, err := strconv.Atoi(r.PathValue("i"))
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "replica index: " + err.Error()})
			return
		}
		on := r.URL.Query().Get("on") != "false"
		switch r.PathValue("action") {
		case "stop":
			err = s.Stop(i)
		case "restart":
			err = s.Restart(i)
		case "errors":
			err = s.SetErrors(i, on)
		case "metrics-hang":
			err = s.SetMetricsHang(i, on)
		case "requests-hang":
			err = s.SetRequestsHang(i, on)
		default:
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "unknown action " + r.PathValue("action")})
			return
		}
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, s.Status())
	})
	mux.HandleFunc("POST /engines/{i}/slow", func(w http.ResponseWriter, r *http.Request) {
		i, err := strconv.Atoi(r.PathValue("i"))
		if err == nil {
			var f float64
			f, err = strconv.ParseFloat(r.URL.Query().Get("factor"), 64)
			if err == nil {
				err = s.SetSlow(i, f)
			}
		}
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"engine": i, "slow": r.URL.Query().Get("factor")})
	})
	return mux
}
