// Package redisserver runs a throwaway redis-server on loopback for tests
// and the demo: no persistence, a free port, stopped and restarted at will
// (a restart loses every key, as a real restart without persistence does).
package redisserver

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// Binary is the server program looked up in PATH.
const Binary = "redis-server"

// ErrMissing says redis-server is not installed.
var ErrMissing = errors.New("redis-server not found in PATH (Debian: apt-get install redis-server)")

// Server is one redis-server process on 127.0.0.1.
type Server struct {
	Addr string // 127.0.0.1:port
	port int
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

// TB is what ForTest needs of a test or benchmark (testing.TB).
type TB interface {
	Helper()
	Skip(args ...any)
	Fatal(args ...any)
	Cleanup(func())
}

// ForTest starts a server for a test and stops it when the test ends; the
// test is skipped when redis-server is not installed.
func ForTest(tb TB) *Server {
	tb.Helper()
	s, err := Start()
	if err == ErrMissing {
		tb.Skip("redis-server is not installed (Debian: apt-get install redis-server); the shared store tests need it")
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Close)
	return s
}

// Start starts redis-server on a free loopback port and waits until it
// answers PING.
func Start() (*Server, error) {
	if _, err := exec.LookPath(Binary); err != nil {
		return nil, ErrMissing
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("finding a free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir, err := os.MkdirTemp("", "lmw-redis-")
	if err != nil {
		return nil, err
	}
	s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), port: port, dir: dir}
	if err := s.start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

func (s *Server) start() error {
	s.cmd = exec.Command(Binary, "--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir, "--protected-mode", "yes")
	s.cmd.Stdout, s.cmd.Stderr = nil, nil
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", Binary, err)
	}
	s.done = make(chan struct{})
	go func(c *exec.Cmd, done chan struct{}) {
		_ = c.Wait()
		close(done)
	}(s.cmd, s.done)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := s.Do("PING"); err == nil {
			return nil
		}
		select {
		case <-s.done:
			return fmt.Errorf("%s exited at start (port %d taken?)", Binary, s.port)
		default:
		}
		if time.Now().After(deadline) {
			s.Stop()
			return fmt.Errorf("%s did not answer on %s within 10s", Binary, s.Addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop kills the server and waits for it to exit. Stopping a stopped
// server does nothing.
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}

// Restart starts the server again on the same port, empty.
func (s *Server) Restart() error {
	s.Stop()
	return s.start()
}

// Close stops the server and removes its directory.
func (s *Server) Close() {
	s.Stop()
	os.RemoveAll(s.dir)
}

// Do sends one command (arguments without spaces or newlines are enough
// for the tests' INFO, DBSIZE, FLUSHALL, GET) and returns the reply as
// text: a bulk string's contents, an integer's digits, a status line.
func (s *Server) Do(args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", s.Addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		return "", err
	}
	rd := bufio.NewReader(c)
	line, err := rd.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", errors.New("empty reply")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", errors.New(line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return "", err
		}
		if n < 0 {
			return "", nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(rd, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	return "", fmt.Errorf("unexpected reply %q", line)
}

// Info returns one field of INFO section, e.g. Info("memory",
// "used_memory").
func (s *Server) Info(section, field string) (string, error) {
	out, err := s.Do("INFO", section)
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), field+":"); ok {
			return v, nil
		}
	}
	return "", fmt.Errorf("INFO %s has no %s", section, field)
}

// Commands returns the number of commands the server has processed
// (INFO stats total_commands_processed).
func (s *Server) Commands() (int64, error) {
	v, err := s.Info("stats", "total_commands_processed")
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(v, 10, 64)
}
