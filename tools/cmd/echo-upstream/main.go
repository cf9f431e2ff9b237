// Command echo-upstream is the upstream of scripts/overhead: it reads each
// request's body to its end and answers a short JSON document, and serves
// an empty Prometheus exposition at /metrics, so what a load test through
// Caddy measures is the proxy, not an engine.
//
//	echo-upstream -listen 127.0.0.1:18400
package main

import (
	"flag"
	"io"
	"log"
	"net/http"
	"strconv"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:18400", "address to listen on")
	flag.Parse()
	reply := []byte(`{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"ok"}],"usage":{"input_tokens":1,"output_tokens":1}}`)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = io.WriteString(w, "# no series\n")
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Body-Bytes", strconv.FormatInt(n, 10))
		_, _ = w.Write(reply)
	})
	log.Fatal(http.ListenAndServe(*listen, mux))
}
