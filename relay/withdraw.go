package relay

// Withdraw takes the Server out of service ahead of Shutdown, for a load
// balancer: from now on Draining reports true, so the admin port's /readyz
// answers 503 and a balancer's health check stops sending the hub new
// connections, while the Server goes on accepting and serving exactly as
// before. Shutdown then stops accepting and drains. Withdraw cannot be
// undone; calling it again does nothing. It is safe for concurrent use.
func (s *Server) Withdraw() {
	s.serving.withdrawn.Store(true)
}
