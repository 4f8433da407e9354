package cluster

import (
	"errors"
	"sync"
)

// Parallel calls f(0) ... f(n-1) on workers goroutines (bulk writes to the
// API server, as benchmarks make them) and returns the errors joined.
func Parallel(n, workers int, f func(i int) error) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	work := make(chan int)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := f(i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	return errors.Join(errs...)
}
