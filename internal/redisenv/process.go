package redisenv

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// binaryCandidates are tried, in order, after PATH. Tests replace it.
var binaryCandidates = []string{"/usr/bin/redis-server", "/usr/local/bin/redis-server"}

// errHidden is wrapped, together with ErrNoRedisServer, when StandInEnv
// hides an installed binary.
var errHidden = errors.New("redis-server hidden by " + StandInEnv + "=1")

// binary returns the redis-server binary cfg may use: none when cfg forces
// the stand-in.
func binary(cfg config) (string, error) {
	if cfg.standIn {
		return "", fmt.Errorf("%w (%w)", ErrNoRedisServer, errHidden)
	}
	return findBinary()
}

// findBinary returns the path of a redis-server binary or ErrNoRedisServer.
func findBinary() (string, error) {
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p, nil
	}
	for _, p := range binaryCandidates {
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", ErrNoRedisServer
}

// errAddrInUse marks a launch that failed because its port was taken; the
// caller picks another port and tries again.
var errAddrInUse = errors.New("address already in use")

const (
	logName = "redis.log"
	outName = "stdout.log"
)

// proc is one running redis-server. Its goroutine reaps the process and ends
// when it exits, so kill (which waits for done) leaves nothing behind.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited and been reaped
	err  error         // cmd.Wait's result; read only after done is closed
}

// launch starts redis-server on port with dir as its working directory and
// waits until that very process answers, or returns an error carrying the
// tail of its logs; errAddrInUse is in the chain when the port was taken.
func launch(bin, dir string, port int, extra []string, timeout time.Duration) (p *proc, version string, err error) {
	// redis-server appends to its log: start each attempt with an empty
	// one, so that an earlier attempt's lines cannot explain this one's
	// failure.
	_ = os.Remove(filepath.Join(dir, logName))
	args := []string{
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--protected-mode", "no",
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--dir", dir,
		"--logfile", filepath.Join(dir, logName),
		"--enable-debug-command", "local",
	}
	args = append(args, extra...)

	out, err := os.OpenFile(filepath.Join(dir, outName), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, "", fmt.Errorf("redisenv: output file: %w", err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = out, out // an *os.File: no copying goroutine
	cmd.SysProcAttr = sysProcAttr()
	err = cmd.Start()
	out.Close() // the child holds its own descriptor
	if err != nil {
		return nil, "", fmt.Errorf("redisenv: starting %s: %w", bin, err)
	}
	p = &proc{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()

	version, err = waitReady(p, port, timeout)
	if err != nil {
		p.kill()
		tail := logTail(dir)
		if strings.Contains(tail, "Address already in use") {
			err = fmt.Errorf("%w: %w", err, errAddrInUse)
		}
		return nil, "", fmt.Errorf("redisenv: redis-server on 127.0.0.1:%d: %w\n--- log tail ---\n%s", port, err, tail)
	}
	return p, version, nil
}

// kill sends SIGKILL, which also ends a stopped process, and waits until the
// process is reaped. It is safe to call more than once.
func (p *proc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// waitReady polls until the process answers INFO on port with its own
// process id (so a stranger that owns the port does not count), and returns
// the server's version. It gives up when the process exits or timeout passes.
func waitReady(p *proc, port int, timeout time.Duration) (string, error) {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var lastErr error
	for {
		// Check for an exit first: select picks among ready cases at
		// random, and a process that died on a taken port must not be
		// mistaken for one that is slow to answer.
		select {
		case <-p.done:
			return "", fmt.Errorf("process exited before answering: %v", p.err)
		default:
		}
		info, err := infoServer(addr)
		if err == nil {
			if pid := infoField(info, "process_id"); pid != strconv.Itoa(p.cmd.Process.Pid) {
				err = fmt.Errorf("port answered by process %s, not ours (%d)", pid, p.cmd.Process.Pid)
			} else {
				return infoField(info, "redis_version"), nil
			}
		}
		lastErr = err
		select {
		case <-p.done:
			return "", fmt.Errorf("process exited before answering: %v", p.err)
		case <-deadline.C:
			return "", fmt.Errorf("no answer within %v (last error: %v)", timeout, lastErr)
		case <-tick.C:
		}
	}
}

// infoServer sends INFO server over a fresh connection and returns the reply.
func infoServer(addr string) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, 250*time.Millisecond)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	// Short, as the caller retries: a stranger holding the port may accept
	// and never answer.
	if err := conn.SetDeadline(time.Now().Add(250 * time.Millisecond)); err != nil {
		return "", err
	}
	if _, err := io.WriteString(conn, "*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n"); err != nil {
		return "", err
	}
	r := bufio.NewReader(conn)
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if !strings.HasPrefix(line, "$") {
		return "", fmt.Errorf("INFO replied %q", line)
	}
	n, err := strconv.Atoi(line[1:])
	if err != nil || n < 0 {
		return "", fmt.Errorf("INFO replied %q", line)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return "", err
	}
	return string(body), nil
}

// infoField returns the value of "name:value" in an INFO reply.
func infoField(info, name string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), name+":"); ok {
			return v
		}
	}
	return ""
}

// logTail returns the last lines of the server's log and captured output.
func logTail(dir string) string {
	var b strings.Builder
	for _, name := range []string{logName, outName} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || len(bytes.TrimSpace(data)) == 0 {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(lines) > 20 {
			lines = lines[len(lines)-20:]
		}
		fmt.Fprintf(&b, "[%s]\n%s\n", name, strings.Join(lines, "\n"))
	}
	if b.Len() == 0 {
		return "(no output)"
	}
	return b.String()
}
