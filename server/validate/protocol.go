package validate

import "sync"

// ProtocolError records the first protocol violation of a caller's
// stream (a message out of order), set by the goroutine that reads the
// stream and read by the handler when the stream ends.
type ProtocolError struct {
	mu  sync.Mutex
	err error
}

func (p *ProtocolError) Set(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err == nil {
		p.err = err
	}
}

func (p *ProtocolError) Get() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}
